"""The verl plugin's tests: run in the ``divrl[verl]`` environment (``make test-verl``).

``make test`` does not collect this folder (pyproject's ``testpaths``), and the core
environment has no verl.
"""

import pytest

verl = pytest.importorskip("verl", reason="the verl extra is not installed (make test-verl)")
