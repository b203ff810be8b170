"""The app's calls to live runs that need the workflow's code: updates and queries.

:class:`LiveRuns` is a part of :class:`~perdure.app.App` (a base class of
it). An update is checked by the workflow's validator before the client
sends it; a query is answered by the workflow's query function from the
run's journal. The live-run calls that need no workflow code (events,
streams) are the client's (:mod:`perdure.liveclient`).
"""

from __future__ import annotations

import abc
from typing import Any

from perdure import client as client_api
from perdure import errors, registry, twins


class LiveRuns(abc.ABC):
    """The update and query calls of an App."""

    # What the App supplies.
    _workflows: dict[str, registry.WorkflowDef]

    @property
    @abc.abstractmethod
    def client(self) -> client_api.Client:
        """The app's client."""

    def update(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        update_id: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send the update ``name`` to a live run and return the run's answer.

        The workflow's validator for ``name``, if this app registers one, runs
        here first; see :meth:`perdure.client.Client.update` for the rest.

        Raises:
            errors.UpdateRejected: the validator raised; nothing was stored.
            errors.UpdateAbandoned: the run ended without answering.
            errors.UpdateTimedOut: no answer within ``timeout`` seconds.
            errors.RunFinished: the run had already ended.
        """
        wf = self._workflows.get(self.client.get(run_id).workflow)
        validator = wf.validators.get(name) if wf is not None else None
        return self.client.update(run_id, name, payload, update_id, timeout, validator=validator)

    def query(self, run_id: str, name: str) -> Any:
        """Answer the workflow's query ``name`` about a run, from its durable journal.

        Needs no worker and writes nothing.

        Raises:
            errors.UnknownQuery: the run's workflow has no such query here.
            errors.QueryFailed: the query function raised.
        """
        view = self.client.view(run_id)
        wf = self._workflows.get(view.workflow)
        found = wf.queries.get(name) if wf is not None else None
        if found is None:
            known = sorted(wf.queries) if wf is not None else []
            hint = f" (known: {', '.join(known)})" if known else ""
            raise errors.UnknownQuery(
                f"workflow {view.workflow} has no query named {name!r} in this app{hint}"
            )
        try:
            return found(view)
        except Exception as exc:
            raise errors.QueryFailed(
                f"query {name!r} of run {run_id} raised {type(exc).__name__}: {exc}"
            ) from exc

    # An update waits for the run's answer; a query runs the workflow's own code.
    aupdate = twins.blocking_twin(update)
    aquery = twins.blocking_twin(query)
