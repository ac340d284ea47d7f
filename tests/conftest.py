import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# A suite started in the background from a shell without job control (`cmd &`, nohup) inherits SIGINT
# ignored, and so would every child it starts (an ignored signal survives exec; a handler does not).
# The Ctrl-C tests send SIGINT on purpose, to this process and to a transcribe child: give it back
# Python's KeyboardInterrupt, as an interactive run has it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
