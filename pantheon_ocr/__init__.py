"""pantheon-ocr: bulk OCR of PDFs and page images with LightOnOCR GGUF models on its own engine.

    import pantheon_ocr
    reader = pantheon_ocr.Reader()            # the bundled reader, or model="lightonocr-2", ...
    for page in reader.read("scan.pdf"):
        print(page.page, page.text)

The command line (`pantheon-ocr`) runs the same pipeline; see pantheon_ocr/api.py.
"""

__version__ = "0.1.0"
__all__ = ["Page", "Reader", "RunInterrupted"]


def __getattr__(name: str):
    # Lazy: `import pantheon_ocr` (and `pantheon-ocr --help`) stays instant, no numpy loaded.
    if name == "RunInterrupted":  # what Reader.transcribe raises on Ctrl-C, for callers to catch
        from .pipeline.types import RunInterrupted

        return RunInterrupted
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'pantheon_ocr' has no attribute {name!r}")
