"""Tutorial, part 4: a parent run that fans out to child runs."""

from __future__ import annotations

import perdure

app = perdure.App("sqlite:///tutorial.db", name="album")


@app.step()
def resize(image: str, width: int) -> str:
    return f"{image.removesuffix('.png')}-{width}.png"


@app.step()
def upload(title: str, files: list[str]) -> str:
    return f"https://photos.example/{title} ({len(files)} files)"


@app.workflow(version="1")
def thumbnails(ctx: perdure.Context, image: str) -> list[str]:
    if not image.endswith(".png"):
        raise ValueError(f"{image} is not a PNG file")
    return [resize(image, width) for width in (64, 256)]


@app.workflow(version="1")
def publish_album(ctx: perdure.Context, title: str, files: list[str]) -> str:
    return upload(title, files)


@app.workflow(version="1")
def album(ctx: perdure.Context, title: str, images: list[str]) -> str:
    handles = ctx.map(thumbnails, images)  # one child run per image, started together
    try:
        files = [name for handle in handles for name in handle.result()]
    except perdure.ChildFailed as failed:
        return f"not published: {failed.error.get('message')}"
    cover = ctx.start_child(publish_album, title, files, key="publish")
    return str(cover.result())
