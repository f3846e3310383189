"""Reading shards from object storage: ``s3://``, ``gs://``, ``az://``, ``http(s)://`` and
anything else fsspec understands (``pip install 'stoker[storage]'``).

- :mod:`stoker.storage.cache`: :class:`ShardCache`, a local folder with a size limit and
  least-recently-used eviction, shared safely by the processes of one user, whose copies
  are of the objects' versions (ETag, version id, or modification time and size);
- :mod:`stoker.storage.prefetch`: :class:`Prefetcher`, the next shards of a worker's list
  downloading in background threads;
- :mod:`stoker.storage.fetch`: downloads retried with exponential backoff
  (:class:`RetryPolicy`), failing with :class:`RemoteReadError` naming the URL;
- :mod:`stoker.storage.http_stream`: an ``http(s)://`` object streamed front to back,
  resumed where it stopped after a network failure;
- :mod:`stoker.storage.remote`: :class:`Storage`, what a reader keeps for its URLs.

The readers (``TextLines``, ``JsonLines``, ``TarShards``, ``PackedDataset``) take URLs
where they take paths, with ``storage_options=``, ``cache=``, ``prefetch=`` and
``retries=``; see docs/object-storage.md.
"""

from stoker.storage.cache import CachedFile, ShardCache
from stoker.storage.fetch import RemoteReadError, RetryPolicy, is_transient
from stoker.storage.prefetch import Prefetcher
from stoker.storage.remote import Storage, is_remote

__all__ = [
    "CachedFile",
    "Prefetcher",
    "RemoteReadError",
    "RetryPolicy",
    "ShardCache",
    "Storage",
    "is_remote",
    "is_transient",
]
