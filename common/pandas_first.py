"""Imported for its effect: pandas is imported here, before pyarrow would import it by itself.

pyarrow imports pandas lazily, on the first call that asks whether pandas is
there (``pa.scalar``, ``pa.array`` of Python objects, ...), inside a Cython
function that cannot raise: an exception during that import is printed and
dropped. A Ctrl-C arriving in that second (pandas takes ~0.3 s to import) was
lost, the CLI command went on as if never interrupted, and pyarrow went on
believing pandas is missing. Imported here, by a plain import statement, a
Ctrl-C interrupts it as it does any import. The modules that are kvlease's
first users of pyarrow (``common.logentry``, ``common.codec_arrays``) import
this module before pyarrow.
"""

import pandas  # noqa: F401
