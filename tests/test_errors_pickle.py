"""PantheonError's pickling contract: every typed error the library defines crosses a process
boundary (a render worker, a benchmark child) as itself: its class, message, exit code and the
attributes its words come from."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import pantheon_ocr
from pantheon_ocr.errors import InputError, ModelError, NetworkError, OptionError, PantheonError, WriteError


class Full(WriteError, OSError):  # the typed error first in the MRO, OSError after it (pickled by name)
    pass


def all_error_classes() -> list[type]:
    for info in pkgutil.walk_packages(pantheon_ocr.__path__, "pantheon_ocr."):
        if info.name.startswith(("pantheon_ocr.engine.backends.coreml", "pantheon_ocr.archive.ray")):
            continue  # need extras that may be absent; their errors are the base classes'
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    seen, todo = [], [PantheonError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return seen


EXAMPLES = [
    ModelError("/m/x.gguf", "not a GGUF file", option="model"),
    InputError("/d/a.pdf", "the page cannot be loaded", page=3),
    OptionError("device", "unknown", "tpu"),
    NetworkError("https://hub", "timed out", setting="timeout"),
    PantheonError("plain"),
]


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_a_typed_error_unpickles_as_itself(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error) and back.exit_code == error.exit_code


def test_every_error_class_in_the_package_keeps_the_contract():
    classes = all_error_classes()
    assert len(classes) >= 15  # the package's own, not just the base
    for cls in classes:
        if issubclass(cls, OSError):
            continue  # test_an_error_that_is_also_an_oserror_keeps_its_errno
        error = cls.__new__(cls)
        error.args = (f"{cls.__name__} message",)
        error.detail = {"page": 2}
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and back.args == error.args and back.detail == {"page": 2}, cls


def test_an_error_that_is_also_an_oserror_keeps_its_errno():
    import errno
    import threading

    from pantheon_ocr.pipeline.files import PlantedPath

    for error in (PlantedPath(errno.ELOOP, "a link where the output folder goes", "/out/a"),
                  Full(errno.ENOSPC, "No space left on device", "/out/a.md")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.errno, back.strerror, back.filename) == (error.errno, error.strerror, error.filename)
    held = ModelError("/m/x.gguf", "busy")
    held.lock = threading.Lock()  # an attribute that cannot pickle: its text comes through
    back = pickle.loads(pickle.dumps(held))
    assert str(back) == "/m/x.gguf: busy" and back.path == "/m/x.gguf" and back.lock == str(held.lock)
