"""A scenario that breaks guarantee 3 on purpose: the explorer must report it.

``pay`` charges the card from workflow code, outside any step: nothing
journals it, so a replay after a crash charges again.
"""

from __future__ import annotations

import perdure
from perdure.testing import chaos

app = perdure.App(name="chaos_broken")


@app.step()
def quote(order: str) -> int:
    chaos.effect("quote")
    return 100


@app.step()
def receipt(order: str) -> str:
    chaos.effect("receipt")
    return f"receipt:{order}"


@app.workflow(version="1")
def pay(ctx: perdure.Context, order: str) -> str:
    cents = quote(order)
    # The bug under test: an effect in workflow code, which every replay repeats.
    chaos.effect(f"charge:{cents}", once=True, key=f"{ctx.run_id}/charge")
    return receipt(order)


def drive(d: chaos.Drive) -> None:
    d.start(pay, "o-1", key="o-1")
    d.run_until_idle()


scenario = chaos.Scenario("unjournaled_charge", app, drive)
