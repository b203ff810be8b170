"""The workflow of docs/testing.md: a one-day sleep, then a signal with a timeout."""

from __future__ import annotations

from datetime import timedelta

import perdure

app = perdure.App(name="onboarding")
sent: list[str] = []


@app.step()
def send_email(user: str, kind: str) -> str:
    sent.append(f"{kind}:{user}")
    return f"{kind} mail to {user}"


@app.workflow(version="1")
def onboarding(ctx: perdure.Context, user: str) -> dict[str, str]:
    send_email(user, "welcome")
    ctx.sleep(timedelta(days=1))
    send_email(user, "tips")
    try:
        plan = ctx.wait("upgrade", timeout=timedelta(days=7))
    except perdure.WaitTimedOut:
        return {"user": user, "plan": "free"}
    return {"user": user, "plan": str(plan)}
