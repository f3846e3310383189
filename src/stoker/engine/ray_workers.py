"""Workers as Ray actors: loading on the CPUs of other machines, with stoker's guarantees.

``DataLoader(worker_mode="ray")`` or ``worker_mode=RayWorkers(...)`` runs each worker as a
Ray actor instead of a process of this machine. Everything else is the process engine's:
the trainer still owns the sampler and :class:`~stoker.engine.multi_worker.MultiWorkerIterator`
still schedules, reorders, re-issues and accounts; :class:`RayPool` stands where
:class:`~stoker.engine.pool.WorkerPool` stands, with the same methods.

One batch, Ray's way:

1. the iterator sends a :class:`~stoker.engine.messages.Task`: :meth:`RayPool.send` calls
   the actor's ``handle`` method with the message's number in that actor's sequence, and
   gets an object reference back at once;
2. inside the actor, stoker's worker loop (:func:`stoker.engine.worker.run_worker`, the
   one process and thread workers run: seeding, ``worker_init_fn``, per-sample random
   scopes, fetch and collate) runs in a thread of its own and takes the messages in their
   numbered order, so it sees ``StartEpoch`` before the epoch's tasks, as a process worker
   does. It answers ``Done`` / ``Failed`` / ``Exhausted``, which become the call's return
   value. There is no shared memory across machines: Ray puts a large return value in its
   object store, where numpy arrays travel as raw buffers, while the loop already loads
   the next batch;
3. :meth:`RayPool.poll` waits on every reference in flight, fetches the ready ones
   together (concurrent pulls from the other nodes), and hands the answers to the
   iterator in each actor's call order. The time the fetch takes is the batch's
   transport time in ``loader.stats()``, per actor and per node.

An actor that dies, or whose node dies, makes its references fail with Ray's actor
error: :meth:`RayPool.poll` reports a :class:`RayDeath` naming the actor, its node and
Ray's reason, and the iterator restarts it (``on_worker_death="restart"``) and re-issues
its batches, or raises. Shutdown kills every actor (``ray.kill``) and drops every
reference the pool holds; Ray also ends the actors of a driver that exits.

``import stoker`` never imports Ray: this module imports it when a pool starts, through
:func:`stoker._extras.require`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np

from stoker._errors import WorkerError
from stoker._tree import map_leaves
from stoker._validate import check_number
from stoker.engine import random_scopes, transport
from stoker.engine.messages import Done, Failed, Ready, StartupFailed, Task, WorkerSpec
from stoker.engine.pool import Ledger, PoolState, begin_shutdown
from stoker.engine.slots import SlotPool
from stoker.engine.worker import cap_threads, describe_failure, run_worker
from stoker.profiling.memory import GrowthWatch

__all__ = ["RayDeath", "RayPool", "RayWorkers", "ray_options"]

_DEFAULT_START_TIMEOUT_S = 120.0
_STACK_TIMEOUT_S = 5.0
_pool_numbers = count()


@dataclass(frozen=True)
class RayWorkers:
    """Workers as Ray actors: pass it as ``DataLoader(..., worker_mode=RayWorkers(...))``.

    ``num_workers`` stays the number of workers, here actors; ``worker_mode="ray"`` is
    ``RayWorkers()``. Every field is optional.

    Args:
        address: the Ray cluster to join when this process is not connected to one yet
            (``"auto"``, ``"ray://head:10001"``, ``"10.0.0.1:6379"``). ``None``: Ray's own
            rule (the ``RAY_ADDRESS`` variable, else a new local Ray on this machine). A
            process already connected (``ray.init`` was called) keeps its cluster.
        num_cpus: CPUs each actor reserves (fractions allowed). Match it to the threads a
            sample uses: ``worker_threads`` caps BLAS/OpenMP in each actor, as in process
            workers.
        resources: custom resources each actor asks for, such as ``{"preprocess": 1}`` to
            keep the actors on the machines started with ``--resources='{"preprocess":
            8}'`` and off the GPU machines.
        memory: bytes of memory each actor reserves with Ray's scheduler, or ``None``.
        runtime_env: Ray's ``runtime_env`` for the actors (``{"working_dir": "."}``,
            ``{"pip": [...]}``), for datasets whose code is not installed on every machine.
        zero_copy: hand out batches whose arrays are read-only views of Ray's object store
            (default): no copy in the trainer, and a batch you hold keeps its object in the
            store, as a batch of process workers keeps its shared-memory slot. ``False``
            copies each array into the trainer's memory, so batches are writable, as with
            process workers, and the store is freed at once (about 0.2 ms per MiB of the
            trainer's CPU). ``stoker.torch`` copies read-only arrays when it makes tensors,
            so there the two cost the same.
        start_timeout_s: how long an actor may wait to be placed and started before the
            loader raises, naming what it asked for and what the cluster has free.
        init_options: keywords for ``ray.init`` when stoker connects (``namespace``,
            ``num_cpus`` of a new local Ray, ...).

    Example:
        >>> from stoker import RayWorkers
        >>> RayWorkers(num_cpus=2, resources={"preprocess": 1}).actor_options()
        {'num_cpus': 2, 'max_restarts': 0, 'resources': {'preprocess': 1}}
    """

    address: str | None = None
    num_cpus: float = 1.0
    resources: Mapping[str, float] = field(default_factory=dict)
    memory: int | None = None
    runtime_env: Mapping[str, Any] | None = None
    zero_copy: bool = True
    start_timeout_s: float = _DEFAULT_START_TIMEOUT_S
    init_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        num_cpus = check_number("RayWorkers(num_cpus=...)", self.num_cpus)
        object.__setattr__(self, "num_cpus", num_cpus)
        resources: dict[str, float] = {}
        for name, amount in dict(self.resources).items():
            if not isinstance(name, str):
                msg = (
                    "RayWorkers(resources=...) maps resource names to positive amounts, such "
                    f'as {{"preprocess": 1}}; got the name {name!r}'
                )
                raise ValueError(msg)
            where = f"RayWorkers(resources=...)[{name!r}]"
            resources[name] = check_number(where, amount, above=True)
        object.__setattr__(self, "resources", resources)
        timeout = check_number("RayWorkers(start_timeout_s=...)", self.start_timeout_s, above=True)
        object.__setattr__(self, "start_timeout_s", timeout)

    def actor_options(self) -> dict[str, Any]:
        """What each actor asks Ray's scheduler for (``ActorClass.options(**...)``)."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_restarts": 0}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.memory is not None:
            options["memory"] = self.memory
        if self.runtime_env is not None:
            options["runtime_env"] = dict(self.runtime_env)
        return options

    def max_actors(self) -> int:
        """How many such actors the connected Ray cluster holds at most (at least 1)."""
        total = _ray().cluster_resources()
        asked = {"CPU": self.num_cpus, **dict(self.resources)}
        if self.memory:
            asked["memory"] = self.memory
        fits = [int(total.get(name, 0) // amount) for name, amount in asked.items() if amount]
        return max(1, min(fits, default=1))

    def describe_request(self) -> str:
        """The request in words: ``1 CPU and {"preprocess": 1}``."""
        parts = [f"{self.num_cpus:g} CPU"]
        if self.resources:
            parts.append(str(dict(self.resources)))
        if self.memory is not None:
            parts.append(f"{self.memory / 2**20:.0f} MiB of memory")
        return " and ".join(parts)


def ray_options(worker_mode: Any) -> RayWorkers | None:
    """The :class:`RayWorkers` a ``worker_mode`` argument stands for, or None (not Ray)."""
    if isinstance(worker_mode, RayWorkers):
        return worker_mode
    if isinstance(worker_mode, str) and worker_mode == "ray":
        return RayWorkers()
    return None


def _ray() -> Any:
    from stoker._extras import require

    return require("ray", "worker_mode='ray'", "to run workers as Ray actors")


# -- the actor -------------------------------------------------------------------------
class _LoaderActor:
    """One worker, as an async Ray actor around stoker's worker loop.

    The loop (:func:`stoker.engine.worker.run_worker`, the one process and thread workers
    run) lives in a thread of the actor's own, for the actor's whole life, so its
    thread-local state (worker info, random scopes) is one thread's, as in a process
    worker. Each ``handle(seq, message)`` call queues its message for the loop, in
    ``seq`` order whatever order Ray runs the calls in, and returns what the loop answered
    for it. While Ray stores one answer in its object store and sends it, the loop
    already loads the next batch: the hand-off is off the loading path, as with the
    sender thread of a process worker.
    """

    def __init__(self, worker_id: int, spec: WorkerSpec) -> None:
        if spec.threads is not None:
            cap_threads(spec.threads)
        random_scopes.install()  # after the spec's modules (torch, maybe) are imported
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._answers: list[Any] = []
        self._current: tuple[Any, Any] | None = None  # (event loop, future) being answered
        self._lock = threading.Lock()
        self._stopped = False
        self._next = 0
        self._turn: Any = None  # an asyncio.Condition, made in the actor's event loop
        self._thread = threading.Thread(
            target=self._run, args=(worker_id, spec), name="stoker-ray-worker", daemon=True
        )
        self._thread.start()

    # the loop's side, in its thread
    def _run(self, worker_id: int, spec: WorkerSpec) -> None:
        try:
            run_worker(worker_id, spec, self._receive, self._collect, None, True)
        finally:  # it stopped (a start-up failure): every call from now on answers nothing
            with self._lock:
                self._stopped = True
            self._settle_current()
            while True:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    _settle(item[0], item[1], [])

    def _collect(self, message: Any, _allocator: Any) -> None:
        self._answers.append(message)

    def _receive(self) -> Any:
        """The loop asks for its next message: the one before it is fully answered."""
        if self._current is None:
            self._answers = []  # Ready, sent as the loop starts: the hello call says it
        self._settle_current()
        item = self._inbox.get()
        if item is None:
            return None
        loop, future, message = item
        self._current = (loop, future)
        return message

    def _settle_current(self) -> None:
        if self._current is not None:
            answers, self._answers = self._answers, []
            _settle(*self._current, answers)
            self._current = None

    # Ray's side, in the actor's event loop
    async def hello(self) -> tuple[int, str, str, str]:
        """(pid, node id, node address, host name) of this actor."""
        ray = _ray()
        node = ray.get_runtime_context().get_node_id()
        return os.getpid(), node, ray.util.get_node_ip_address(), _hostname()

    async def handle(self, seq: int, message: Any) -> list[Any]:
        """Queues message number ``seq`` for the loop; returns the loop's answers to it."""
        loop = asyncio.get_running_loop()
        if self._turn is None:
            self._turn = asyncio.Condition()
        async with self._turn:
            await self._turn.wait_for(lambda: self._next == seq)
            future = loop.create_future()
            with self._lock:
                if self._stopped:
                    future.set_result([])
                else:
                    self._inbox.put((loop, future, message))
            self._next += 1
            self._turn.notify_all()
        return await future

    async def stack(self) -> str:
        """The loop thread's Python stack, as text (for a batch that takes too long)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is None:
            return "(the worker loop is not running)"
        return "".join(traceback.format_stack(frame))


def _settle(loop: Any, future: Any, answers: list[Any]) -> None:
    """Resolves an actor call's future from the loop thread."""

    def resolve() -> None:
        if not future.done():
            future.set_result(answers)

    with contextlib.suppress(RuntimeError):  # the event loop is closed: the actor is ending
        loop.call_soon_threadsafe(resolve)


def _hostname() -> str:
    return socket.gethostname()


# -- deaths ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RayDeath:
    """An actor found dead: which worker, which actor on which node, and why."""

    worker_id: int
    actor: str  # the actor's name
    actor_id: str
    node: str  # "node <id> (<address>)" or "an unknown node"
    reason: str

    @property
    def pid(self) -> None:
        return None

    def describe(self, *, starting: bool = False) -> str:
        who = (
            f"worker {self.worker_id} (Ray actor {self.actor}, id {self.actor_id}, on {self.node})"
        )
        if starting:
            return (
                f"{who} {self.reason} while starting, before it loaded any batch: in "
                "worker_init_fn, while unpickling the dataset, or while importing its modules on "
                "that node (they must be importable there: install them, or pass "
                "RayWorkers(runtime_env=...)). With num_workers=0 the same code runs in this "
                "process, where a debugger can stop at it. A replacement would fail the same way, "
                "so stoker does not start one."
            )
        return f"{who} {self.reason}"


def _death_reason(error: BaseException, node_alive: bool | None) -> str:
    """Ray's reason for an actor error, in a phrase."""
    text = getattr(error, "error_msg", None) or str(error)
    lines = [
        line.strip()
        for line in str(text).splitlines()
        if line.strip() and not line.startswith("\t") and "died unexpectedly" not in line
    ]
    said = lines[-1] if lines else type(error).__name__
    if node_alive is False:
        return f"was lost with its node, which left the cluster (Ray: {said})"
    return f"died (Ray: {said})"


# -- the pool --------------------------------------------------------------------------
class _Lost(Exception):
    """An actor's call failed because the actor, or its node, is gone."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class _Call:
    """A method call in flight on an actor, in the order it was made."""

    ref: Any
    message: Any  # None: the hello call that follows the actor's creation
    generation: int


@dataclass(slots=True)
class _Actor:
    handle: Any
    name: str
    generation: int
    created: float
    calls: collections.deque[_Call] = field(default_factory=collections.deque)
    sent: int = 0  # messages sent so far: the next one's place in the actor's queue
    pid: int | None = None
    node_id: str = ""
    node_address: str = ""
    host: str = ""

    def where(self) -> str:
        if not self.node_id:
            return "a node not known yet (the actor had not started)"
        return f"node {self.node_id[:12]} ({self.node_address}, host {self.host})"


class RayPool:
    """Runs ``num_workers`` Ray actors and carries messages to and from them.

    Provides :class:`~stoker.engine.pool.Pool`, as :class:`~stoker.engine.pool.WorkerPool`
    does, so :class:`~stoker.engine.multi_worker.MultiWorkerIterator` runs an epoch over
    actors as it does over processes.

    Args:
        spec: what every worker needs (dataset, collate_fn, ...).
        num_workers: how many actors.
        options: where they run and what they reserve.
        recorder: the loader's statistics, for per-actor and per-node throughput.
    """

    mode = "ray"

    def __init__(
        self, spec: WorkerSpec, num_workers: int, options: RayWorkers, recorder: Any = None
    ) -> None:
        ray = _ray()
        self._ray = ray
        self.spec = spec
        self.options = options
        self.num_workers = num_workers
        self.state = PoolState.RUNNING
        self._owner_pid = os.getpid()
        self.slots: SlotPool | None = None  # no shared memory across machines: Ray carries them
        self.prefix = ""
        self.pids: dict[int, int] = {}
        self.initialised: set[int] = set()
        self.ledger = Ledger(load=[0] * num_workers)
        self.memory_watch: GrowthWatch | None = None  # the actors' memory is Ray's to watch
        self.batch_bytes: int | None = None
        self.warned_unsharded = False
        self.deferred: list[int] = []  # every actor starts at once: Ray places them in parallel
        self.ramp = False
        self.transport_s = 0.0
        self._recorder = recorder
        self._number = next(_pool_numbers)
        self._actors: list[_Actor | None] = [None] * num_workers
        self._generations = count()
        if not ray.is_initialized():
            init = {"address": options.address, "log_to_driver": True, **options.init_options}
            ray.init(**init)
        self._actor_class = ray.remote(_LoaderActor)
        try:
            self._spec_ref: Any = ray.put(spec)  # pickled once for every actor
            for worker_id in range(num_workers):
                self._start(worker_id)
        except BaseException:
            self.shutdown()
            raise

    # -- starting ----------------------------------------------------------------
    def _start(self, worker_id: int) -> None:
        generation = next(self._generations)
        name = f"stoker-{_hostname()}-{os.getpid()}-{self._number}-w{worker_id}-{generation}"
        options = self.options.actor_options()
        handle = self._actor_class.options(name=name, **options).remote(worker_id, self._spec_ref)
        actor = _Actor(handle, name, generation, time.monotonic())
        actor.calls.append(_Call(handle.hello.remote(), None, generation))
        self._actors[worker_id] = actor

    def is_started(self, worker_id: int) -> bool:
        return self._actors[worker_id] is not None

    def start_deferred(self, limit: int | None = None) -> list[int]:
        return []

    def processes(self) -> list[Any]:
        return []  # no multiprocessing.Process: the actors are Ray's

    def actor_names(self) -> list[str]:
        """The names of the live actors, in worker order (``ray.get_actor`` finds them)."""
        return [a.name for a in self._actors if a is not None]

    def add_worker(self) -> int:
        """Starts one more actor (autotuning); returns its id."""
        worker_id = self.num_workers
        self._actors.append(None)
        self.ledger.load.append(0)
        self.num_workers += 1
        self._start(worker_id)
        return worker_id

    def restart(self, worker_id: int) -> None:
        """Replaces a dead actor with a fresh one under the same worker id."""
        old = self._actors[worker_id]
        if old is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(old.handle, no_restart=True)
            old.calls.clear()
        self._actors[worker_id] = None
        self.initialised.discard(worker_id)
        self._start(worker_id)

    # -- talking -----------------------------------------------------------------
    def send(self, worker_id: int, message: Any) -> bool:
        actor = self._actors[worker_id]
        if actor is None:
            return False
        ref = actor.handle.handle.remote(actor.sent, message)
        actor.sent += 1
        actor.calls.append(_Call(ref, message, actor.generation))
        return True

    def poll(self, timeout: float) -> tuple[list[tuple[int, Any, set[int]]], list[RayDeath]]:
        """Waits up to ``timeout`` s; returns ``(worker_id, message, set())`` and deaths."""
        heads = [a.calls[0].ref for a in self._actors if a is not None and a.calls]
        if not heads:
            time.sleep(min(timeout, 0.01))
            return [], []
        self._check_starts()
        wait = min(timeout, 0.5)  # wake up to check actors that are still being placed
        ready, _ = self._ray.wait(heads, num_returns=1, timeout=wait, fetch_local=False)
        if not ready:
            return [], []
        messages: list[tuple[int, Any, set[int]]] = []
        deaths: list[RayDeath] = []
        for worker_id, call in self._ready_calls():
            actor = self._actors[worker_id]
            if actor is None or actor.generation != call.generation or not actor.calls:
                continue  # that actor died earlier in this poll
            actor.calls.popleft()
            began = time.perf_counter()
            try:
                value = self._fetch(worker_id, call)
            except _Lost as lost:
                deaths.append(self._lost(worker_id, actor, lost.error))
                continue
            spent = time.perf_counter() - began
            if call.message is None:
                messages.append((worker_id, self._hello(worker_id, actor, value), set()))
                continue
            for message in value:
                answer = self._received(worker_id, actor, message, spent)
                messages.append((worker_id, answer, set()))
            self.transport_s += time.perf_counter() - began
        return messages, deaths

    def _ready_calls(self) -> list[tuple[int, _Call]]:
        """The finished calls at the head of each actor's queue: answers in call order."""
        found: list[tuple[int, _Call]] = []
        for worker_id, actor in enumerate(self._actors):
            if actor is None or not actor.calls:
                continue
            calls = list(actor.calls)
            done, _ = self._ray.wait(
                [c.ref for c in calls], num_returns=len(calls), timeout=0, fetch_local=False
            )
            finished = set(done)
            for call in calls:
                if call.ref not in finished:
                    break
                found.append((worker_id, call))
        return found

    def _fetch(self, worker_id: int, call: _Call) -> Any:
        """A finished call's value (pulled from the actor's node when it is another machine)."""
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(call.ref)
        except (exceptions.RayActorError, exceptions.ObjectLostError) as exc:
            raise _Lost(exc) from exc  # the actor, or its answer with its node, is gone
        except exceptions.RayTaskError as exc:  # the answer could not be sent back
            return [unsendable_answer(worker_id, call.message, exc)]

    def _hello(self, worker_id: int, actor: _Actor, value: tuple[int, str, str, str]) -> Ready:
        actor.pid, actor.node_id, actor.node_address, actor.host = value
        return Ready(worker_id=worker_id, pid=actor.pid)

    def _received(self, worker_id: int, actor: _Actor, message: Any, fetch_s: float) -> Any:
        """An answer as the iterator takes it: arrays copied out unless ``zero_copy``."""
        if message.__class__ is not Done or message.batch is None:
            return message
        nbytes, _ = transport.array_bytes(message.batch)
        if self.batch_bytes is None and nbytes:
            self.batch_bytes = nbytes  # memory_budget bounds the batches in flight from now on
        if not self.options.zero_copy:
            message = dataclasses.replace(message, batch=map_leaves(message.batch, _writable))
        if self._recorder is not None:
            pending = self.ledger.pending.get(message.task_id)
            samples = (
                len(pending.indices)
                if pending is not None and pending.indices is not None and self.spec.auto_collation
                else 1
            )
            self._recorder.actor_loaded(
                actor.name, worker_id, actor.where(), samples, nbytes,
                message.fetch_s + message.collate_s, fetch_s,
            )  # fmt: skip
        return message

    def _lost(self, worker_id: int, actor: _Actor, exc: BaseException) -> RayDeath:
        actor_id = str(getattr(exc, "actor_id", None) or actor.handle._actor_id.hex())
        if not actor.node_id:  # it died before it answered: ask Ray where it was placed
            self._locate(actor, actor_id)
        alive = self._node_alive(actor.node_id)
        actor.calls.clear()
        with contextlib.suppress(Exception):
            self._ray.kill(actor.handle, no_restart=True)
        if not getattr(exc, "actor_init_failed", False):
            # killed or lost with its node: nothing says a replacement would fail too (an
            # exception in __init__, the spec's unpickling, would: that one stays a start-up
            # failure)
            self.initialised.add(worker_id)
        reason = _death_reason(exc, alive)
        return RayDeath(worker_id, actor.name, actor_id[:16], actor.where(), reason)

    def _locate(self, actor: _Actor, actor_id: str) -> None:
        """Fills in the node of an actor that never answered, from Ray's actor table."""
        with contextlib.suppress(Exception):
            from ray._private import state

            address = state.actors(actor_id=actor_id)["Address"]
            node_id = address["NodeID"]
            if node_id and set(node_id) != {"f"}:  # Ray's nil id: never placed
                actor.node_id, actor.node_address = node_id, address["IPAddress"]
                actor.host = "?"

    def _node_alive(self, node_id: str) -> bool | None:
        """Whether Ray's cluster still lists that node as alive (None: cannot tell)."""
        if not node_id:
            return None
        deadline = time.monotonic() + 2.0
        while True:
            try:
                nodes = {n["NodeID"]: n["Alive"] for n in self._ray.nodes()}
            except Exception:
                return None
            alive = nodes.get(node_id)
            if alive is False or time.monotonic() > deadline:
                return alive
            time.sleep(0.1)  # Ray marks a lost node dead after its health checks fail

    def _check_starts(self) -> None:
        """Raises when an actor has waited past ``start_timeout_s`` to be placed and start."""
        now = time.monotonic()
        for worker_id, actor in enumerate(self._actors):
            if actor is None or actor.pid is not None:
                continue
            if now - actor.created < self.options.start_timeout_s:
                continue
            try:
                free = self._ray.available_resources()
            except Exception:
                free = {}
            free = {k: v for k, v in free.items() if "node:" not in k}
            msg = (
                f"Ray actor {actor.name} (worker {worker_id}) was not placed and started within "
                f"{self.options.start_timeout_s:g} s. Each actor asks for "
                f"{self.options.describe_request()}; the cluster has free: {free}. Add machines "
                "with those resources, lower num_workers or the request, or raise "
                "RayWorkers(start_timeout_s=...)."
            )
            self.shutdown()  # persistent workers too: the next epoch asks afresh
            raise WorkerError(msg)

    def pid(self, worker_id: int) -> int | None:
        actor = self._actors[worker_id]
        return actor.pid if actor is not None else None

    def cpu_s(self, worker_id: int) -> None:
        """Not read for actors (only thread workers' first batch uses it)."""
        return None

    def dump_stack(self, worker_id: int) -> str:
        """A stuck actor's Python stack, asked of the actor (its loop runs in a thread)."""
        actor = self._actors[worker_id]
        if actor is None:
            return "(no actor)"
        where = f"Ray actor {actor.name}, pid {actor.pid}, on {actor.where()}"
        try:
            stack = self._ray.get(actor.handle.stack.remote(), timeout=_STACK_TIMEOUT_S)
        except Exception as exc:
            return (
                f"({where} did not give its stack ({type(exc).__name__}); run `py-spy dump "
                "--pid` with that pid on that machine)"
            )
        return f"({where})\n{stack}"

    # -- stopping ----------------------------------------------------------------
    def shutdown(self) -> None:
        """Kills every actor and drops every reference this pool holds; idempotent."""
        if not begin_shutdown(self):
            return
        try:
            connected = self._ray.is_initialized()
            for actor in self._actors:
                if actor is None:
                    continue
                actor.calls.clear()
                if connected:
                    with contextlib.suppress(Exception):
                        self._ray.kill(actor.handle, no_restart=True)
        finally:
            self._actors = [None] * len(self._actors)
            self._spec_ref = None
            self.state = PoolState.CLOSED


def unsendable_answer(worker_id: int, message: Any, exc: BaseException) -> Failed | StartupFailed:
    """The answer to ``message`` when Ray could not carry the actor's back (it did not pickle).

    A :class:`~stoker.engine.messages.Task`'s: :class:`Failed`, that batch's error. Any other
    message's (an epoch's start, which runs ``worker_init_fn``): :class:`StartupFailed`, the
    worker's, since no batch was asked for.
    """
    cause = getattr(exc, "cause", None) or exc
    if isinstance(message, Task):
        return Failed(
            task_id=message.task_id,
            epoch=message.epoch,
            worker_id=worker_id,
            failure=describe_failure(cause),
        )
    return StartupFailed(worker_id=worker_id, failure=describe_failure(cause))


def _writable(leaf: Any) -> Any:
    """A read-only array from Ray's object store, copied into this process's memory."""
    if isinstance(leaf, np.ndarray) and not leaf.flags.writeable:
        return leaf.copy()
    return leaf
