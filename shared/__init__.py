"""pobo's common package (see ``docs/architecture.md``).

One process-wide setting is made here, before anything imports numpy: OpenBLAS's idle worker threads spin
for ``2^OPENBLAS_THREAD_TIMEOUT`` CPU cycles after each BLAS call before they sleep (2^28, about a tenth of a
second, by default). pobo's own element-wise passes (``shared.bo.parallel.split``) run right after its BLAS
calls, and spinning BLAS threads would take the cores they need (measured: the GP loop's update pass at
1.7x its time). 2^20 cycles (about 0.4 ms) keeps the threads warm across the back-to-back BLAS calls of a
step over 100 000 candidates (2^18 made that step 1.15x slower: threads went to sleep between calls) and out
of the way of the passes over 1 000 000. OpenBLAS reads the variable once, when it is loaded; a value set
in the environment wins.
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
