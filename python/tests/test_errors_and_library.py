"""Errors (status, name, the thread's message) and how the package finds the library."""

import importlib.util
import os
import pickle
import shutil
import threading

import pytest

from conftest import TINY_MODEL, run_python


def test_missing_file_is_an_io_error(tinyloop, tmp_path):
    missing = tmp_path / "no-such-model.tinyloop"
    with pytest.raises(tinyloop.Error) as caught:
        tinyloop.Model(missing)
    error = caught.value
    assert error.status == tinyloop.Status.IO and int(error.status) == -3
    assert error.status.name == "IO" and error.status_name == "TL_ERR_IO"
    assert str(missing) in error.message
    assert error.function == "tl_model_load"
    assert str(error).startswith("tl_model_load: TL_ERR_IO (-3): ")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.status, copy.message, copy.function) == (error.status, error.message, error.function)


def test_malformed_file_is_a_format_error(tinyloop, tmp_path):
    bad = tmp_path / "bad.tinyloop"
    bad.write_bytes(TINY_MODEL.read_bytes()[:1000])
    with pytest.raises(tinyloop.Error) as caught:
        tinyloop.Model(bad)
    assert caught.value.status in (tinyloop.Status.FORMAT, tinyloop.Status.IO)
    assert caught.value.message


def test_unknown_status_stays_an_int(tinyloop):
    error = tinyloop.Error("tl_something", -99, "from a newer library")
    assert error.status == -99 and not isinstance(error.status, tinyloop.Status)
    assert error.status_name == "unknown status -99"


def test_messages_are_per_thread(tinyloop, tiny):
    """Each thread's error carries its own call's message, even while other threads fail differently."""
    failures = {}

    def fail(name, call):
        for _ in range(50):
            try:
                call()
            except tinyloop.Error as error:
                failures.setdefault(name, set()).add(error.message)

    threads = [
        threading.Thread(target=fail, args=("load", lambda: tinyloop.Model("/nonexistent/a.tinyloop"))),
        threading.Thread(target=fail, args=("score", lambda: tiny.score([1]))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(failures["load"]) == 1 and "/nonexistent/a.tinyloop" in failures["load"].pop()
    (score_message,) = failures["score"]
    assert "nonexistent" not in score_message


def test_version_rule(tinyloop):
    from tinyloop._capi import version_compatible, version_tuple

    assert tinyloop.library_version() == tinyloop.ABI_VERSION == (0, 1, 0)
    assert version_tuple(0x010203) == (1, 2, 3)
    assert version_compatible((0, 1, 7), (0, 1, 0))
    assert not version_compatible((0, 2, 0), (0, 1, 0))  # before 1.0 a minor may change the ABI
    assert version_compatible((1, 3, 0), (1, 2, 0)) and not version_compatible((1, 1, 0), (1, 2, 0))
    assert not version_compatible((2, 0, 0), (1, 0, 0))
    assert tinyloop.build_info()["version"] == "0.1.0"


def test_library_from_the_environment(library_path):
    done = run_python("import tinyloop; print(tinyloop.library_path())",
                      env_update={"TINYLOOP_LIBRARY": str(library_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(library_path)


def test_environment_without_a_file_fails_clearly(tmp_path):
    missing = str(tmp_path / "libtinyloop.so")
    done = run_python(
        "import tinyloop\n"
        "try:\n    tinyloop.Model('x')\nexcept tinyloop.LibraryError as e:\n    print('LibraryError:', e)",
        env_update={"TINYLOOP_LIBRARY": missing})
    assert done.returncode == 0, done.stderr
    assert "LibraryError: TINYLOOP_LIBRARY=" in done.stdout and missing in done.stdout


def test_not_a_library_fails_clearly(tmp_path):
    fake = tmp_path / "libtinyloop.so"
    fake.write_bytes(b"not an ELF file")
    done = run_python("import tinyloop\ntry:\n    tinyloop.library_path()\n"
                      "except tinyloop.LibraryError as e:\n    print('LibraryError:', e)",
                      env_update={"TINYLOOP_LIBRARY": str(fake)})
    assert done.returncode == 0, done.stderr
    assert "LibraryError: cannot load libtinyloop from" in done.stdout


def test_library_from_the_loader_search_path(library_path):
    """Without TINYLOOP_LIBRARY, the system's library: here the loader's search of LD_LIBRARY_PATH."""
    folder = str(library_path.resolve().parent)
    done = run_python("import tinyloop; print(tinyloop.library_path()); print(tinyloop.library_version())",
                      env_update={"LD_LIBRARY_PATH": folder}, env_remove=["TINYLOOP_LIBRARY"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[1] == "(0, 1, 0)"


def test_bundled_library_comes_first(library_path, tmp_path):
    """A copy inside the package folder is used before the system's (a wheel that bundles the library)."""
    import tinyloop

    package = tmp_path / "tinyloop"
    shutil.copytree(os.path.dirname(tinyloop.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__", "libtinyloop.so*"))
    shutil.copy(library_path.resolve(), package / "libtinyloop.so.0")
    done = run_python("import tinyloop; print(tinyloop.library_path())", env_update={"PYTHONPATH": str(tmp_path)},
                      env_remove=["TINYLOOP_LIBRARY", "LD_LIBRARY_PATH"], cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(package / "libtinyloop.so.0")


def test_import_needs_neither_the_library_nor_lm_eval(tmp_path):
    done = run_python(
        "import sys, tinyloop\n"
        "assert 'lm_eval' not in sys.modules and 'tinyloop.lm_eval' not in sys.modules\n"
        "try:\n    tinyloop.Model('x')\nexcept tinyloop.LibraryError:\n    print('no library, as expected')",
        env_update={"TINYLOOP_LIBRARY": str(tmp_path / "none.so")})
    assert done.returncode == 0, done.stderr
    assert "no library, as expected" in done.stdout


def test_lm_eval_module_without_lm_eval_says_so():
    if importlib.util.find_spec("lm_eval") is not None:
        pytest.skip("a real lm_eval is installed")
    done = run_python("import tinyloop.lm_eval")
    assert done.returncode != 0
    assert "tinyloop.lm_eval needs lm-evaluation-harness" in done.stderr
