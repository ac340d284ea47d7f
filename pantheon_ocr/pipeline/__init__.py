"""The page pipeline, a library that knows no command line:

    inputs.py        files, folders, globs -> documents; page selections
    render.py        documents -> page images (PDFium, PIL), run in worker processes
    render_pool.py   the crash-proof worker processes
    run.py           the recipe: plan -> render -> vision stage -> CPU stage -> write
    stages.py        the stage threads (render feeder, vision, CPU) and their bounded queues
    segment.py       a page image -> text regions in reading order (for line and block readers)
    regions.py       any page engine reading each region as its own sequence
    types.py         the contract with the engine and the callers: tasks, results, options
    outputs.py       atomic writers: Markdown per document, per-page files, JSONL
"""
