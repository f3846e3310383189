"""Training from object storage: packed shards from a local S3 server against local disk.

A real S3-compatible server (moto, in a thread on 127.0.0.1) holds a packed dataset; an
HTTP proxy in front of it adds 20 ms to every request, like a nearby cloud region. Each
round, side by side, in alternating order:

- ``local``: ``PackedDataset(folder)`` read front to back through ``stoker.DataLoader``
  (batch 32 of 64 KiB records, no workers), with a simulated training step per batch
  (``--step-ms``, a sleep: the accelerator's time, which leaves the CPU free);
- ``s3 cold``: the same from ``s3://...`` with an empty cache (every shard downloaded
  while the epoch runs, ``prefetch`` shards ahead);
- ``s3 cached``: a second epoch over the same cache folder (every shard a cache hit).

The clock starts when the first batch arrives: opening (the manifest, index and keys
files) and the first shard's download are the start-up, not the steady state this
measures. Ratios are local time / remote time (1.0: as fast as local disk), medians of
the rounds. Then a mid-epoch resume: the loader's state after 3 of the shards, loaded by
a new loader over a new dataset and an empty cache; the proxy counts the GETs of each
data shard (a consumed shard must not be fetched again).

``--ranged`` measures what random access to a few records costs both ways: ranged GETs
of each record (``fs.cat_file(url, start, end)``) against downloading the shards that
hold them; ``--ranged-only`` measures that alone (for shards too large for the epochs).
``--litdata`` (in an environment that has litdata) adds LitData's ``StreamingDataset``
over the same records and server. ``--clients`` measures the two candidate client
libraries (fsspec + s3fs, and obstore where installed) on whole-object and ranged GETs
against the same server.

Run: ``PYTHONPATH=src:tests .venv/bin/python benchmarks/bench_object_storage.py``
(about a minute; needs ``stoker[storage]`` and ``moto[server]``). It asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests"))

from stoker import DataLoader
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.storage import ShardCache
from storage.fault_proxy import FaultProxy, free_port

_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_BUCKET = "bench"
_RECORD = 64 * 1024


class Server:
    """moto's S3 server on 127.0.0.1 and the latency proxy in front of it."""

    def __init__(self) -> None:
        os.environ.update(_ENV)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self.moto.start()
        host, port = self.moto.get_host_and_port()
        assert host in ("127.0.0.1", "localhost")
        self.direct = f"http://127.0.0.1:{port}"
        self.proxy = FaultProxy(port)
        self.fs = self.filesystem(self.direct)
        self.fs.call_s3("create_bucket", Bucket=_BUCKET)

    def options(self, endpoint: str | None = None) -> dict[str, Any]:
        return {
            "endpoint_url": endpoint or self.proxy.endpoint,
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def filesystem(self, endpoint: str) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            skip_instance_cache=True,
            key="bench",
            secret="bench",
            client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
        )

    def upload(self, folder: str, prefix: str) -> str:
        for name in sorted(os.listdir(folder)):
            self.fs.put_file(os.path.join(folder, name), f"{_BUCKET}/{prefix}/{name}")
        return f"s3://{_BUCKET}/{prefix}"

    def close(self) -> None:
        self.proxy.close()
        self.moto.stop()


def write_packed(folder: str, shards: int, shard_mib: int) -> None:
    per_shard = shard_mib * 2**20 // _RECORD
    rng = np.random.default_rng(0)
    with PackedWriter(folder, max_shard_bytes=shard_mib * 2**20 + 4096) as writer:
        for i in range(shards * per_shard):
            writer.add({"x": rng.integers(0, 255, _RECORD, dtype=np.uint8), "label": i})


def timed_epoch(ds: PackedDataset, batch_size: int, step_s: float, state: Any = None) -> float:
    """Seconds from the first batch to the end of the epoch, a training step per batch."""
    loader = DataLoader(ds, batch_size=batch_size)
    if state is not None:
        loader.load_state_dict(state)
    return time_batches(loader, step_s)


def time_batches(batches: Any, step_s: float) -> float:
    """Seconds from the first of ``batches`` to the end, with a ``step_s`` step per batch."""
    start = None
    for _ in batches:
        if start is None:
            start = time.perf_counter()
        time.sleep(step_s)
    assert start is not None
    return time.perf_counter() - start


def streaming(server: Server, args: argparse.Namespace, work: str) -> dict[str, Any]:
    folder = os.path.join(work, "packed")
    write_packed(folder, args.shards, args.shard_mib)
    url = server.upload(folder, "packed")
    server.proxy.delay_s = args.latency_ms / 1000
    step_s = args.step_ms / 1000
    times: dict[str, list[float]] = {"local": [], "s3 cold": [], "s3 cached": []}
    for round_ in range(args.rounds):
        cache_dir = tempfile.mkdtemp(prefix="bench-cache-", dir=work)
        cache = ShardCache(cache_dir, max_bytes=2 * args.shards * args.shard_mib * 2**20)
        remote = PackedDataset(
            url, storage_options=server.options(), cache=cache, prefetch=args.prefetch
        )
        local = PackedDataset(folder)
        if round_ % 2:
            times["local"].append(timed_epoch(local, args.batch_size, step_s))
        times["s3 cold"].append(timed_epoch(remote, args.batch_size, step_s))
        times["s3 cached"].append(timed_epoch(remote, args.batch_size, step_s))
        if round_ % 2 == 0:
            times["local"].append(timed_epoch(local, args.batch_size, step_s))
        remote.close()
        shutil.rmtree(cache_dir)
        print(
            f"round {round_}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()),
            flush=True,
        )
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "medians_s": medians,
        "cold_ratio": medians["local"] / medians["s3 cold"],
        "cached_ratio": medians["local"] / medians["s3 cached"],
        "url": url,
        "folder": folder,
    }


def resume(server: Server, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """GETs per data shard when an epoch is resumed after ``consumed`` shards."""
    server.proxy.delay_s = 0.0
    first = PackedDataset(url, storage_options=server.options(), prefetch=args.prefetch)
    per_shard = first.manifest["shards"][0]["records"]
    loader = DataLoader(first, batch_size=per_shard)
    it = iter(loader)
    consumed = 3
    for _ in range(consumed):
        next(it)
    state = loader.state_dict()
    del it
    first.close()
    server.proxy.reset()
    again = PackedDataset(url, storage_options=server.options(), prefetch=args.prefetch)
    resumed = DataLoader(again, batch_size=per_shard)
    resumed.load_state_dict(state)
    batches = sum(1 for _ in resumed)
    again.close()
    gets = [server.proxy.count(f"shard-{s:05d}.npy") for s in range(args.shards)]
    requests = sum(server.proxy.requests.values())
    return {
        "consumed": consumed,
        "batches_after_resume": batches,
        "gets_per_shard": gets,
        "requests": requests,
    }


def ranged(server: Server, url: str, folder: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--ranged``: random access to ``args.records`` records, ranged GETs against whole shards."""
    server.proxy.delay_s = args.latency_ms / 1000
    local = PackedDataset(folder)
    picks = random.Random(0).sample(range(len(local)), args.records)
    fs = server.filesystem(server.proxy.endpoint)
    starts = [0]
    for shard in local.manifest["shards"]:
        starts.append(starts[-1] + shard["records"])
    offsets = local._open().columns["offset"]  # the record's place in its shard's payload
    lengths = local._open().columns["length"]
    start = time.perf_counter()
    for i in picks:
        shard = int(np.searchsorted(starts, i, side="right") - 1)
        path = f"{url}/shard-{shard:05d}.npy"
        begin = 128 + int(offsets[i])  # after the data file's .npy header
        fs.cat_file(path, start=begin, end=begin + int(lengths[i]))
    ranged_s = time.perf_counter() - start
    cache = tempfile.mkdtemp(prefix="bench-cache-")
    start = time.perf_counter()
    whole = PackedDataset(url, storage_options=server.options(), cache=cache, prefetch=0)
    for i in picks:
        whole[i]
    whole_s = time.perf_counter() - start
    whole.close()
    shutil.rmtree(cache)
    shards = len({int(np.searchsorted(starts, i, side="right") - 1) for i in picks})
    return {
        "records": args.records,
        "ranged_s": ranged_s,
        "whole_s": whole_s,
        "shards_touched": shards,
    }


def litdata_epochs(server: Server, args: argparse.Namespace, work: str) -> dict[str, Any]:
    """``--litdata``: LitData's StreamingDataset over the same records, from the same server.

    Run in a separate environment that has litdata (stoker does not depend on it). Its chunks
    are written with ``litdata.streaming.cache.Cache`` at the same 4 MiB, read through its
    ``StreamingDataLoader`` (batch 32, no workers), timed like stoker's side.
    """
    import litdata.streaming.downloader as litdata_downloader
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.cache import Cache

    # its obstore client refuses plain http, which the local server speaks (a cloud is https)
    options_name = "_OBSTORE_CLIENT_OPTIONS"
    client_options = getattr(litdata_downloader, options_name, None)
    if isinstance(client_options, dict):
        setattr(litdata_downloader, options_name, {**client_options, "allow_http": "true"})

    folder = os.path.join(work, "litdata")
    writer = Cache(folder, chunk_bytes=args.shard_mib * 2**20)
    rng = np.random.default_rng(0)
    per_shard = args.shard_mib * 2**20 // _RECORD
    for i in range(args.shards * per_shard):
        writer[i] = {"x": rng.integers(0, 255, _RECORD, dtype=np.uint8), "label": i}
    writer.done()
    writer.merge()
    url = server.upload(folder, "litdata")
    server.proxy.delay_s = args.latency_ms / 1000
    step_s = args.step_ms / 1000
    options = {
        "endpoint_url": server.proxy.endpoint,
        "aws_access_key_id": "bench",
        "aws_secret_access_key": "bench",
        "region_name": "us-east-1",
    }
    times: dict[str, list[float]] = {"litdata cold": [], "litdata cached": []}
    for round_ in range(args.rounds):
        cache_dir = tempfile.mkdtemp(prefix="bench-litdata-", dir=work)
        ds = StreamingDataset(
            url, cache_dir=cache_dir, storage_options=options, max_pre_download=args.prefetch
        )
        for name in times:
            loader = StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=0)
            times[name].append(time_batches(loader, step_s))
        shutil.rmtree(cache_dir)
        print(
            f"round {round_}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()),
            flush=True,
        )
    return {k: statistics.median(v) for k, v in times.items()}


def clients(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """``--clients``: fsspec + s3fs against obstore, whole objects and ranged reads."""
    server.proxy.delay_s = 0.0
    payload = os.urandom(args.shard_mib * 2**20)
    keys = [f"clients/object-{i:03d}" for i in range(16)]
    for key in keys:
        server.fs.pipe_file(f"{_BUCKET}/{key}", payload)
    readers: dict[str, tuple[Any, Any]] = {}
    fs = server.filesystem(server.direct)
    readers["fsspec+s3fs"] = (
        lambda key: fs.cat_file(f"{_BUCKET}/{key}"),
        lambda key, a, b: fs.cat_file(f"{_BUCKET}/{key}", start=a, end=b),
    )
    try:
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            _BUCKET,
            endpoint=server.direct,
            access_key_id="bench",
            secret_access_key="bench",
            region="us-east-1",
            client_options={"allow_http": True},
        )
        readers["obstore"] = (
            lambda key: obstore.get(store, key).bytes(),
            lambda key, a, b: obstore.get_range(store, key, start=a, end=b),
        )
    except ImportError:
        print("obstore is not installed: measuring fsspec only")
    results: dict[str, Any] = {}
    for name, (whole, part) in readers.items():
        whole_s, ranged_s = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for key in keys:
                assert len(whole(key)) == len(payload)
            whole_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            for k in range(256):
                a = (k * 7919 * _RECORD) % (len(payload) - _RECORD)
                assert len(part(keys[k % len(keys)], a, a + _RECORD)) == _RECORD
            ranged_s.append(time.perf_counter() - start)
        mib = len(keys) * len(payload) / 2**20
        results[name] = {
            "whole_MiB_s": mib / statistics.median(whole_s),
            "ranged_ms_per_read": 1000 * statistics.median(ranged_s) / 256,
        }
        print(f"{name}: {results[name]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--shard-mib", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--step-ms", type=float, default=25.0, help="simulated training step per batch"
    )
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request")
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--records", type=int, default=32, help="records read at random with --ranged"
    )
    parser.add_argument("--ranged", action="store_true")
    parser.add_argument(
        "--ranged-only",
        action="store_true",
        help="only the --ranged figure (no epochs: for large shards)",
    )
    parser.add_argument("--clients", action="store_true")
    parser.add_argument(
        "--litdata", action="store_true", help="also LitData (needs litdata installed)"
    )
    args = parser.parse_args(argv)
    server = Server()
    work = tempfile.mkdtemp(prefix="bench-object-storage-")
    try:
        if args.clients:
            clients(server, args)
            return
        if args.ranged_only:
            folder = os.path.join(work, "packed")
            write_packed(folder, args.shards, args.shard_mib)
            r = ranged(server, server.upload(folder, "packed"), folder, args)
            print(
                f"{args.shards} shards x {args.shard_mib} MiB, +{args.latency_ms:g} ms per request:"
                f" {r['records']} random records over {r['shards_touched']} shards: ranged GETs "
                f"{r['ranged_s']:.3f} s, whole shards {r['whole_s']:.3f} s"
            )
            return
        result = streaming(server, args, work)
        m = result["medians_s"]
        step = f"{args.step_ms:g} ms step per batch of {args.batch_size} x 64 KiB"
        print(
            f"\n{args.shards} shards x {args.shard_mib} MiB, {step}, +{args.latency_ms:g} ms per "
            f"request, prefetch={args.prefetch}, median of {args.rounds} rounds"
        )
        print(f"  local disk      {m['local']:.3f} s")
        print(
            f"  s3, cold cache  {m['s3 cold']:.3f} s  ratio {result['cold_ratio']:.3f}  (target "
            ">= 0.9)"
        )
        print(
            f"  s3, 2nd epoch   {m['s3 cached']:.3f} s  ratio {result['cached_ratio']:.3f}  "
            "(target >= 0.95)"
        )
        res = resume(server, result["url"], args)
        refetched = sum(res["gets_per_shard"][: res["consumed"]])
        print(
            f"  resume after {res['consumed']} shards: GETs of consumed shards {refetched}, "
            f"GETs per shard {res['gets_per_shard']}, requests in all {res['requests']}"
        )
        if args.litdata:
            lit = litdata_epochs(server, args, work)
            print(
                f"  litdata, cold   {lit['litdata cold']:.3f} s  ratio "
                f"{m['local'] / lit['litdata cold']:.3f}"
            )
            print(
                f"  litdata, cached {lit['litdata cached']:.3f} s  ratio "
                f"{m['local'] / lit['litdata cached']:.3f}"
            )
        if args.ranged:
            r = ranged(server, result["url"], result["folder"], args)
            print(
                f"  {r['records']} random records over {r['shards_touched']} shards: ranged GETs "
                f"{r['ranged_s']:.3f} s, whole shards {r['whole_s']:.3f} s"
            )
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
