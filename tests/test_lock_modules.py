"""store/lock.py picks a RootLock per root (lock_local.py, lock_gcs.py); both implement the
interface in lock_base.py and import only it: no import circle."""

import ast
import inspect

import pytest

from beam_pipeline.store import lock, lock_base, lock_gcs, lock_local


def _imported(module):
    tree = ast.parse(inspect.getsource(module))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            names |= {f"{n.module}.{a.name}" for a in n.names} | {n.module}
    return names


def test_the_implementations_import_the_interface_not_the_api():
    for module in (lock_base, lock_local, lock_gcs):
        assert "beam_pipeline.store.lock" not in _imported(module), module.__name__
    assert not {"beam_pipeline.store.lock_local", "beam_pipeline.store.lock_gcs"} & _imported(
        lock_base)
    assert issubclass(lock_local.LocalLock, lock_base.RootLock)
    assert issubclass(lock_gcs.GcsLock, lock_base.RootLock)
    assert lock.LockHeld is lock_base.LockHeld and lock.LockLost is lock_base.LockLost


def test_a_local_lock_through_the_interface(tmp_path):
    root = str(tmp_path / "ds")
    held = lock_local.LocalLock(root)
    assert held.try_acquire() is None
    try:
        other = lock_local.LocalLock(root)
        holder, age = other.try_acquire()  # taken: who holds it, and since when
        assert holder["token"] == held.token == held.holder()["token"]
        assert holder["state"] == "running" and age is not None and age >= 0
        held.check()
        lock.check_token(root, held.token)
        with pytest.raises(lock.LockLost, match=f"lost the lock on {root} .*nothing published"):
            lock.check_token(root, "another build's token")
    finally:
        held.release()
    assert held.holder() is None  # released: the file is gone
