"""Stream transforms: shuffle, bucket and mix iterable datasets, resumably.

* :class:`ShuffleBuffer` (and ``shuffle_buffer=`` of :class:`~stoker.formats.text.TextLines`,
  :class:`~stoker.formats.text.JsonLines` and :class:`~stoker.formats.tar.TarShards`):
  a seeded, resumable shuffle buffer;
* :class:`BucketStream`: batches of samples of similar length, formed on the fly;
* :func:`mix` / :class:`Mix`: a weighted, deterministic interleaving of several datasets.

See ``docs/streams.md`` for what each guarantees.
"""

from __future__ import annotations

from stoker.streams.bucketing import BucketStream
from stoker.streams.mixing import Mix, mix
from stoker.streams.shuffle import ShuffleBuffer

__all__ = ["BucketStream", "Mix", "ShuffleBuffer", "mix"]
