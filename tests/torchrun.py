"""torchrun, as the tests start it: ``python tests/torchrun.py ARGS`` is ``torchrun ARGS``.

Its agent imports torch with the cycle collector paused, then freezes what the import
made, as the scripts it runs do: a full collection over torch's objects costs a
process a fraction of a second of CPU, and the suite starts many agents.
"""

import gc

gc.disable()

from torch.distributed.run import main

gc.freeze()
gc.enable()

if __name__ == "__main__":
    main()
