"""Throughput benchmarks (figures, never assertions).

    pages.py      the real page pipeline per configuration, configurations side by side
    stages.py     decoder, vision encoder, prefill and batched decode on their own
    isolation.py  one process per configuration: its own peak RSS and BLAS thread count
    synthetic.py  synthetic pages and PDFs to benchmark on
"""
