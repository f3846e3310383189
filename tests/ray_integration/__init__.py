"""stoker's Ray workers on a real multi-node Ray cluster on this machine, every address loopback.

The folder is not named ``ray``: ``tests/`` is on the import path, and a ``tests/ray``
package would shadow Ray itself. ``ray_datasets.py`` holds what the actors unpickle,
``cluster_helpers.py`` what the tests and ``conftest.py`` ask of the cluster.
"""
