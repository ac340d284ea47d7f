"""pantheon-ocr: bulk OCR with LightOnOCR GGUF models on a numpy engine."""

__version__ = "0.1.0"
