"""The machinery that turns index batches into collated batches, and carries them to you.

One batch, hop by hop, with the file that does each step:

0. ``iter(loader)`` starts the pool the epoch needs and waits for its workers'
   ``worker_init_fn`` (``boot.py``), as torch's ``iter()`` does; the epoch itself waits for
   the first ``next()``.
1. ``loader.py`` (:meth:`stoker.DataLoader._begin_epoch`) decides the epoch: its number and
   seed, the sampler's order, the batches a resumed epoch skips. It hands the engine a
   :class:`~stoker.engine.messages.WorkerSpec` (what to load), an
   :class:`~stoker.engine.plan.EpochPlan` (how to run the epoch) and
   :class:`~stoker.engine.plan.EpochHooks` (what to report back). The engine never sees the
   loader.
2. ``num_workers=0``: ``single_process.py`` loads the batch in the calling thread with the
   fetchers of ``fetch.py`` and hands it out. Every other hop is for workers.
3. ``multi_worker.py`` (:class:`~stoker.engine.multi_worker.MultiWorkerIterator`) takes the
   next index batch from the sampler, picks a worker, reserves a batch slot
   (``slots.py``) and sends a :class:`~stoker.engine.messages.Task` (``messages.py``)
   through the pool (``pool.py``, which starts, watches and stops the workers; any pool
   that provides :class:`~stoker.engine.pool.Pool` will do).
4. ``worker.py`` receives the task, fetches the samples and collates them (``fetch.py``)
   straight into the slot's shared memory (``slots.py`` over the raw segments of
   ``segments.py``), and answers :class:`~stoker.engine.messages.Done`.
5. ``transport.py`` encodes the answer: the batch's structure is pickled, its arrays
   travel as references into the slot, so a few hundred bytes cross the pipe.
6. Back in ``multi_worker.py``, the answer is decoded into zero-copy views of the slot,
   waits in the reorder buffer until its turn (``in_order=True``), and goes out through
   ``EpochHooks.deliver`` (``stoker.torch`` turns it into tensors there). The slot goes back
   to the pool when the last view of the batch is collected.
7. ``worker_mode="auto"``: as each batch goes out, ``mode_trial.py``
   (:class:`~stoker.engine.mode_trial.ModeTrial`) times the delivered batches, first from
   thread workers, then from process workers, and says when to switch kinds. The
   iterator then stops dispatching, lets the old pool's batches in flight arrive, and
   :meth:`~stoker.engine.multi_worker.MultiWorkerIterator._swap_pool` takes a new pool of
   the other kind from ``EpochHooks.replace_pool``: the iterator stops an old pool it
   owns, the loader makes the new one and stops a persistent old one. Task numbers go on
   from where the old pool stopped, and the epoch goes on at the sampler's next batch,
   from hop 3, in the new pool.

Alongside: ``random_scopes.py`` serves global random draws from per-sample generators
(the seeding story is in :mod:`stoker.seeding`), ``autotune.py`` grows workers and prefetch
while an epoch runs (``"auto"``), ``termination.py`` stops every pool on SIGTERM, and
``ray_workers.py`` stands in for ``pool.py`` when the workers are Ray actors on other
machines (``worker_mode="ray"``: the same worker loop, answers through Ray's object store
instead of shared memory).
``docs/engine.md`` has the design notes.
"""
