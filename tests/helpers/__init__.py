"""Support shared by the test suite and its child processes: the BFS program and graphs
(:mod:`helpers.bfs`), the child-process scenario runner (:mod:`helpers.scenarios`) and the
contracts the fake backends and drivers implement (:mod:`helpers.contracts`).

``tests/`` is on ``sys.path`` for the tests (pytest's rootdir conftest) and for their children
(``fakecuda.child_env``), so these import as ``helpers.<module>``.
"""
