"""The page pipeline, a library that knows no command line:

    inputs.py        files, folders, globs -> documents; page selections
    render.py        documents -> page images (PDFium, PIL), run in worker processes; images here
    pdf.py           PDFs: the open document, its page tree, a page rendered, its text layer
    pagefile.py      what both share: the page count, the fitted size, a regular file
    render_pool.py   the crash-proof worker processes
    run.py           the recipe: plan -> render -> vision stage -> CPU stage -> write
    stages.py        the stage threads (render feeder, vision, CPU) and their bounded queues
    segment.py       a page image -> text regions in reading order (for line and block readers)
    pieces.py        a line too wide for the reader cut into pieces, their texts joined again
    ink.py           ink masks, grounds, blank runs: what segment.py and pieces.py measure
    regions.py       any page engine reading each region as its own sequence
    types.py         the contract with the engine and the callers: tasks, results, options
    naming.py        where a document's outputs go, and the source record they carry
    claims.py        those names settled against the output folder; which documents are done
    outputs.py       atomic writers: Markdown per document, per-page files, JSONL
"""
