"""App: the registry of workflows and steps, bound to one store, with a client."""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
import types
from collections.abc import Callable, Coroutine, Iterator
from datetime import timedelta
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

from perdure import (
    applive,
    appmigrations,
    appplans,
    appsteps,
    codec,
    context,
    errors,
    payloads,
    plans,
    queues,
    records,
    registry,
    schedules,
    timetable,
    twins,
)
from perdure import client as client_api
from perdure import codec as json_codec
from perdure import telemetry as telemetry_api
from perdure import worker as worker_api
from perdure.store import DEFAULT_LEDGER_LIMIT, default_url, open_store, port

P = ParamSpec("P")
R = TypeVar("R")

# How long ended runs are kept before a worker's sweep deletes them.
DEFAULT_RETENTION = timedelta(days=30)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


class _ClientCall(Generic[P, R]):
    """An App attribute that is one of its client's calls, bound to ``app.client``.

    The call is written once, on the Client; the App neither restates its
    signature nor its async twin.
    """

    def __init__(self, call: Callable[Concatenate[client_api.Client, P], R]) -> None:
        self._call = call
        self.__doc__ = call.__doc__

    @overload
    def __get__(self, app: None, owner: type[App]) -> _ClientCall[P, R]: ...

    @overload
    def __get__(self, app: App, owner: type[App]) -> Callable[P, R]: ...

    def __get__(self, app: App | None, owner: type[App]) -> _ClientCall[P, R] | Callable[P, R]:
        if app is None:
            return self
        return cast(Callable[P, R], types.MethodType(self._call, app.client))


class App(
    timetable.Timetable,
    applive.LiveRuns,
    queues.Queues,
    appplans.PlanRegistry,
    appsteps.Steps,
    appmigrations.Migrations,
):
    """A named set of workflows and steps bound to one store.

    The store is opened on first use, so importing a module that defines an
    app touches nothing. ``App()`` with no URL uses ``$PERDURE_STORE``, else
    ``sqlite:///perdure.db``. A store object (another adapter, or a test
    wrapper such as :class:`perdure.testing.faults.FaultyStore`) is used as
    given. ``ledger_limit`` is how many provenance receipts the runs this app
    creates keep; it is stored with each run, so other processes keep and
    check that run by the same bound. ``telemetry`` receives the engine's
    instrumentation hooks (``perdure.otel.OpenTelemetry()`` for spans and
    metrics; the default does nothing).

    ``codec`` (a :class:`perdure.PayloadCodec`, e.g. :class:`perdure.FernetCodec`)
    seals every payload this app's clients and workers write, and opens every
    one they read; ``payload_store`` (e.g. :class:`perdure.FilePayloadStore`)
    takes the payloads whose stored form is over ``offload_above`` bytes
    (256 KiB), the database keeping a reference and a digest. ``payload_limit``
    bounds a payload's JSON before the codec: 2 MiB, or 64 MiB with a payload
    store (see :mod:`perdure.payloads`).
    """

    def __init__(
        self,
        store: str | port.Store | None = None,
        name: str = "default",
        *,
        clock: port.Clock | None = None,
        ledger_limit: int = DEFAULT_LEDGER_LIMIT,
        max_failures: int = 8,
        payload_limit: int | None = None,
        retention: timedelta | None = DEFAULT_RETENTION,
        telemetry: telemetry_api.Telemetry | None = None,
        codec: payloads.PayloadCodec | None = None,
        payload_store: payloads.PayloadStore | None = None,
        offload_above: int = payloads.DEFAULT_OFFLOAD_ABOVE,
    ) -> None:
        if not _NAME.match(name):
            raise errors.InvalidInput(f"app name {name!r} must be a short identifier")
        if max_failures < 1:
            raise errors.InvalidInput(f"max_failures must be at least 1, got {max_failures}")
        if payload_limit is None:
            payload_limit = (
                json_codec.DEFAULT_PAYLOAD_LIMIT
                if payload_store is None
                else payloads.OFFLOAD_PAYLOAD_LIMIT
            )
        # One layer seals every payload this app writes and opens every one it reads.
        self.payloads = payloads.Payloads(payload_limit, codec, payload_store, offload_above)
        if retention is not None and retention <= timedelta(0):
            raise errors.InvalidInput(f"retention must be positive or None, got {retention}")
        self.name = name
        # A store object (an adapter of your own, or a test wrapper) is used
        # as given; a URL is opened on first use.
        self.url = store if isinstance(store, str) or store is None else store.url
        self.clock = clock
        self.ledger_limit = ledger_limit
        self.max_failures = max_failures
        self.payload_limit = payload_limit
        self.retention = retention
        self.telemetry = telemetry or telemetry_api.NONE
        self._workflows: dict[str, registry.WorkflowDef] = {}
        # The app's own schema in the store's database (see migration()).
        self._migrations: dict[int, Callable[[Any], object]] = {}
        self._schedules: dict[str, schedules.Schedule] = {}
        self._queues: dict[str, queues.Queue] = {}
        self._plans: dict[str, plans.Plan] = {}
        self._store: port.Store | None = None if isinstance(store, str | None) else store
        self._store_given = self._store is not None
        self._client: client_api.Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"App(name={self.name!r}, store={self.url or default_url()!r})"

    # -- store ----------------------------------------------------------------

    def use_store(self, url: str) -> None:
        """Point the app at another store before it is first used."""
        if self._store is not None:
            raise errors.InvalidInput("the app's store is already open")
        self.url = url

    @property
    def store(self) -> port.Store:
        """The app's store, opened (and migrated) on first use."""
        with self._lock:
            if self._store is None:
                self._store = open_store(self.url, clock=self.clock, ledger_limit=self.ledger_limit)
            return self._store

    @property
    def client(self) -> client_api.Client:
        """The app's client: the calls that need no workflow code."""
        if self._client is None:
            self._client = client_api.Client(
                self.store, self.name, self.telemetry, payloads=self.payloads.lenient()
            )
        return self._client

    @contextlib.contextmanager
    def using(self, store: port.Store) -> Iterator[port.Store]:
        """Point the app at ``store`` (a test's throwaway store) inside the block.

        The app's own store, if open, stays open and is used again afterwards.
        """
        with self._lock:
            saved = (self._store, self._store_given, self._client, self.url)
            self._store, self._store_given, self._client = store, True, None
            self.url = store.url
        try:
            yield store
        finally:
            with self._lock:
                self._store, self._store_given, self._client, self.url = saved

    def close(self) -> None:
        """Close the store's connections."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
                self._client = None

    # -- registry -------------------------------------------------------------

    # Bare ``@app.workflow`` passes the function itself as ``name``.
    @overload
    def workflow(  # type: ignore[overload-overlap]
        self, name: Callable[Concatenate[context.Context, P], Coroutine[Any, Any, R]], /
    ) -> registry.AsyncWorkflow[P, R]: ...

    @overload
    def workflow(
        self, name: Callable[Concatenate[context.Context, P], R], /
    ) -> registry.SyncWorkflow[P, R]: ...

    @overload
    def workflow(
        self,
        name: str | None = None,
        *,
        version: str = "1",
        parent_close: registry.ParentClose = "abandon",
    ) -> registry.Register: ...

    def workflow(
        self,
        name: str | Callable[..., Any] | None = None,
        *,
        version: str = "1",
        parent_close: registry.ParentClose = "abandon",
    ) -> Any:
        """Register a workflow function; its first parameter receives the Context.

        Use it as ``@app.workflow``, ``@app.workflow()`` or
        ``@app.workflow("name", version="2")``. Returns a
        :class:`~perdure.registry.Workflow` that stays callable as the function
        and types ``app.start`` and its handle.

        ``parent_close`` says what happens to a run of this workflow started
        as a child when its parent ends (succeeded, failed or canceled) first:
        ``"abandon"`` (the default) lets it run on; ``"cancel"`` cancels it
        and its descendants, as ``app.cancel`` does.
        """
        if callable(name):
            return self.workflow(None, version=version, parent_close=parent_close)(name)
        if name is not None and not isinstance(name, str):
            raise errors.InvalidInput(f"a workflow name must be a string, got {name!r}")
        if parent_close not in ("abandon", "cancel"):
            raise errors.InvalidInput(
                f"parent_close is 'abandon' or 'cancel', got {parent_close!r}"
            )

        def register(fn: Callable[..., Any]) -> registry.Workflow[Any, Any]:
            wf_name = name or fn.__name__
            if not _NAME.match(wf_name):
                raise errors.InvalidInput(f"workflow name {wf_name!r} must be a short identifier")
            if wf_name in self._workflows or wf_name in self._plans:
                raise errors.InvalidInput(f"workflow {wf_name!r} is registered twice")
            params = codec.param_hints(fn)
            first = next(iter(inspect.signature(fn).parameters), None)
            params.pop(first or "", None)
            positional = [p for p in inspect.signature(fn).parameters][1:]
            ordered = {p: params.get(p) for p in positional}
            is_async = inspect.iscoroutinefunction(fn)
            definition = registry.WorkflowDef(
                name=wf_name,
                version=str(version),
                fn=fn,
                is_async=is_async,
                params=ordered,
                returns=codec.return_hint(fn),
                parent_close=parent_close,
            )
            self._workflows[wf_name] = definition
            fn.__perdure_workflow__ = wf_name  # type: ignore[attr-defined]
            kind = registry.AsyncWorkflow if is_async else registry.SyncWorkflow
            return kind(fn, wf_name, str(version), definition)

        return cast(registry.Register, register)

    def _plan_names_taken(self) -> set[str]:
        return set(self._workflows)

    def workflow_def(self, name: str) -> registry.WorkflowDef | None:
        return self._workflows.get(name)

    def workflow_versions(self) -> list[tuple[str, str]]:
        return [(w.name, w.version) for w in self._workflows.values()]

    def workflow_ref(self, workflow: Any) -> tuple[str, str, Any]:
        """Return (name, version, return hint) for a workflow function or name."""
        wf_name = (
            workflow
            if isinstance(workflow, str)
            else getattr(workflow, "__perdure_workflow__", None)
        )
        wf = self._workflows.get(wf_name) if isinstance(wf_name, str) else None
        if wf is None:
            raise errors.WorkflowNotFound(str(wf_name or workflow), list(self._workflows))
        return wf.name, wf.version, wf.returns

    @property
    def workflows(self) -> dict[str, registry.WorkflowDef]:
        return dict(self._workflows)

    # -- client calls ---------------------------------------------------------

    @overload
    def start(
        self, workflow: registry.Workflow[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> client_api.RunHandle[R]: ...

    # With a key the arguments are checked when the call runs, not by type
    # checkers: a ParamSpec admits no keyword of its own next to P.kwargs.
    @overload
    def start(
        self,
        workflow: registry.Workflow[P, R],
        /,
        *args: Any,
        key: str | None,
        dry_run: bool = False,
        **kwargs: Any,
    ) -> client_api.RunHandle[R]: ...

    # Likewise with a queue: the run's queue, key and priority travel as keywords.
    @overload
    def start(
        self,
        workflow: registry.Workflow[P, R],
        /,
        *args: Any,
        queue: str | queues.Queue,
        queue_key: str | None = None,
        priority: int | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> client_api.RunHandle[R]: ...

    @overload
    def start(
        self,
        workflow: registry.Workflow[P, R],
        /,
        *args: Any,
        dry_run: bool,
        key: str | None = None,
        **kwargs: Any,
    ) -> client_api.RunHandle[R]: ...

    @overload
    def start(
        self,
        workflow: str,
        /,
        *args: Any,
        key: str | None = None,
        dry_run: bool = False,
        **kwargs: Any,
    ) -> client_api.RunHandle[Any]: ...

    def start(
        self,
        workflow: registry.Workflow[Any, Any] | str,
        /,
        *args: Any,
        key: Any = None,
        dry_run: Any = False,
        **kwargs: Any,
    ) -> client_api.RunHandle[Any]:
        """Start a run of ``workflow`` (a registered workflow or its name).

        The arguments are checked against the workflow's signature and type
        hints here, so a bad call is refused before anything is stored.
        ``dry_run=True`` starts a dry run: only ``app.worker(dry_run=True)``
        claims it, and its effectful steps are described, not performed. A
        workflow with a parameter named ``dry_run`` takes the keyword as its
        argument (as with ``key``).

        Raises:
            errors.WorkflowNotFound: no such workflow is registered.
            errors.InvalidInput: the arguments do not fit the workflow.
            errors.KeyConflict: ``key`` names a run of another workflow or with
                other arguments.
            errors.InvalidQueue: a queue key or priority without a queue, or a bad priority.
            errors.UnknownQueue: ``queue`` names no queue of the app.
        """
        plan = self.plan_of(workflow)
        if plan is not None:
            return self._start_plan(plan, args, kwargs, key=key, dry_run=dry_run)
        name, version, hint = self.workflow_ref(workflow)
        wf = self._workflows[name]
        key, kwargs = registry.split_key(wf, workflow, key, kwargs)
        # deadline= is the run's, unless the workflow takes an argument of that name.
        deadline = None if "deadline" in wf.params else kwargs.pop("deadline", None)
        dry, kwargs = registry.split_dry_run(wf, dry_run, kwargs)
        placed = self.placement(wf, kwargs)
        registry.check_arguments(wf, args, kwargs)
        return self.client.start(
            name,
            version,
            args,
            kwargs,
            key=key,
            hint=hint,
            deadline=deadline,
            dry_run=dry,
            **placed,
        )

    def _start_plan(
        self,
        plan: plans.Plan,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: Any,
        dry_run: Any,
    ) -> client_api.RunHandle[Any]:
        """Start a run of ``plan``: its roots take ``args`` and ``kwargs``."""
        if dry_run:
            raise errors.InvalidInput(f"plan {plan.name!r}: a plan run cannot be a dry run")
        appplans.refuse_run_options(plan, kwargs)
        appplans.check_start(plan, args, kwargs)
        spec = appplans.plan_spec(plan)
        return self.client.start(plan.name, plan.version, args, kwargs, key=key, plan=spec)

    def tasks(self, run_id: str) -> list[records.TaskInfo]:
        """Return the tasks of a plan run in declaration order (see ``perdure.TaskInfo``)."""
        return self.client.tasks(run_id)

    def handle(self, run_id: str) -> client_api.RunHandle[Any]:
        """Return a handle on an existing run (its result typed by the workflow's hint)."""
        info = self.client.get(run_id)
        wf = self._workflows.get(info.workflow)
        return self.client.handle(run_id, wf.returns if wf else None)

    def fork(
        self, run_id: str, from_step: str | None = None, *, live: bool = False
    ) -> client_api.RunHandle[Any]:
        """Start a new run reusing ``run_id``'s journal up to ``from_step`` (see Client.fork)."""
        forked = self.client.fork(run_id, from_step, live=live)
        return self.handle(forked.run_id)

    astart = twins.athread(start)
    ahandle = twins.athread(handle)
    afork = twins.athread(fork)
    atasks = twins.athread(tasks)

    # The calls that need no workflow code are the client's, bound to the app's client.
    get = _ClientCall(client_api.Client.get)
    runs = _ClientCall(client_api.Client.runs)
    signal = _ClientCall(client_api.Client.signal)
    send = _ClientCall(client_api.Client.send)
    waits = _ClientCall(client_api.Client.waits)
    resume = _ClientCall(client_api.Client.resume)
    suspend = _ClientCall(client_api.Client.suspend)
    cancel = _ClientCall(client_api.Client.cancel)
    resolve = _ClientCall(client_api.Client.resolve)
    children = _ClientCall(client_api.Client.children)
    history = _ClientCall(client_api.Client.history)
    attempts = _ClientCall(client_api.Client.attempts)
    aattempts = _ClientCall(client_api.Client.aattempts)
    aget = _ClientCall(client_api.Client.aget)
    aruns = _ClientCall(client_api.Client.aruns)
    asignal = _ClientCall(client_api.Client.asignal)
    asend = _ClientCall(client_api.Client.asend)
    awaits = _ClientCall(client_api.Client.awaits)
    aresume = _ClientCall(client_api.Client.aresume)
    asuspend = _ClientCall(client_api.Client.asuspend)
    acancel = _ClientCall(client_api.Client.acancel)
    aresolve = _ClientCall(client_api.Client.aresolve)
    achildren = _ClientCall(client_api.Client.achildren)
    ahistory = _ClientCall(client_api.Client.ahistory)

    # -- talking to live runs -------------------------------------------------

    # update and query run the workflow's validators and queries (applive.LiveRuns);
    # the calls below need no workflow code.
    events = _ClientCall(client_api.Client.events)
    get_event = _ClientCall(client_api.Client.get_event)
    read_stream = _ClientCall(client_api.Client.read_stream)
    aevents = _ClientCall(client_api.Client.aevents)
    aget_event = _ClientCall(client_api.Client.aget_event)

    # -- workers --------------------------------------------------------------

    def worker(
        self,
        concurrency: int = 8,
        lease_ttl: float | timedelta = 30,
        heartbeat: float | timedelta = 5,
        **options: Any,
    ) -> worker_api.Worker:
        """Return a Worker serving this app (``.run()``, ``.start()``/``.stop()``, or ``with``).

        ``grace`` (seconds, default 30) bounds how long a stopping worker lets
        in-flight steps finish; ``liveness="thread"`` renews leases from a
        thread of this process instead of the keeper process.
        ``ownership`` is ``"run-lease"`` (default), ``"store-lease"`` (with
        ``lease_wait`` and ``standby``) or ``"none"`` (docs/howto/postures.md);
        ``dry_run=True`` makes a worker that claims dry runs only.
        ``warm`` (default: ``concurrency``; 0: none) parked runs are kept in
        memory for ``warm_for`` seconds (default 5) and go on without a replay
        when this worker takes them up again (``perdure.warm``).
        ``eager`` (default True): a run started in this process while the
        worker has a slot free is created claimed by it (``perdure.starts``).

        Raises:
            errors.LeaseTimingInvalid: (a ValueError) when ``heartbeat`` is not
                below ``lease_ttl`` and at most a third of it.
        """
        ttl = lease_ttl.total_seconds() if isinstance(lease_ttl, timedelta) else float(lease_ttl)
        beat = heartbeat.total_seconds() if isinstance(heartbeat, timedelta) else float(heartbeat)
        worker_api.validate_timing(ttl, beat)
        store = self.store
        self.migrate()  # the tables the app's transaction steps write
        self.save_queues()  # every worker claims under the limits declared last
        # A test clock that moves wakes the worker at once (FakeClock.subscribe).
        subscribe = getattr(self.clock, "subscribe", None)
        if callable(subscribe):
            subscribe(store.notify_ready)
        # Another process can renew leases only on a store it can open the same
        # way: from the URL, on the store's own clock.
        if not self._store_given and self.clock is None:
            options.setdefault("store_url", self.url or default_url())
        options.setdefault("telemetry", self.telemetry)
        made = worker_api.Worker(
            self, store, concurrency=concurrency, lease_ttl=ttl, heartbeat=beat, **options
        )
        if callable(subscribe):
            # Its schedules' next tick is judged by the store's clock, which just moved.
            subscribe(made.clock_moved)
        return made
