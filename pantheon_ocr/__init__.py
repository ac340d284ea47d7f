"""pantheon-ocr: bulk OCR of PDFs and page images with LightOnOCR GGUF models on its own engine.

    import pantheon_ocr
    reader = pantheon_ocr.Reader()            # the bundled reader, or model="lightonocr-2", ...
    for page in reader.read("scan.pdf"):
        print(page.page, page.text)

The command line (`pantheon-ocr`) runs the same pipeline; see pantheon_ocr/api.py.
"""

__version__ = "0.1.0"
# The errors a caller catches (PantheonError is every one of them, each with its exit_code), and
# DocumentNote, the warning read() gives of what it noticed
_ERRORS = ("PantheonError", "UsageError", "OptionError", "ModelError", "InputError", "WriteError", "NetworkError",
           "ResourceError", "DocumentNote")
__all__ = ["Page", "Reader", "RunInterrupted", "RunSummary", *_ERRORS]


def __getattr__(name: str):
    # Lazy: `import pantheon_ocr` (and `pantheon-ocr --help`) stays instant, no numpy loaded.
    if name in ("RunInterrupted", "RunSummary"):  # what Reader.transcribe raises on Ctrl-C / returns
        from .pipeline import types

        return getattr(types, name)
    if name in _ERRORS:
        from . import errors

        return getattr(errors, name)
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'pantheon_ocr' has no attribute {name!r}")
