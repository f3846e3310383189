"""Shared checks for the hard properties.

* ``leaks``: nothing a test started outlives it (run after every test by ``tests/conftest.py``);
* ``save_load``: the save / load-state round trip, parametrised over worker kinds and orders.
"""
