"""The tolerances of the flashcards and the definitions (judged by ``gatepool.lab.common.relative_error``).

Equalities are checked as the largest difference relative to the output's largest magnitude, against
float32 rounding (rtol 1e-5, as ``gatepool.analysis.symmetry.default_tolerance``); the contrasts ("breaks",
"depends") must exceed 100× that rounding tolerance, a bar of ours (the flashcards give no number).
"""

from __future__ import annotations

RTOL = 1e-5  # float32 rounding, relative to the output's scale
ROUNDING = "float32 rounding: rtol 1e-5 of the output's largest magnitude (as symmetry.default_tolerance)"
FAR = 100 * RTOL
FAR_WHY = "a difference 100× the float32 rounding tolerance cannot be rounding"
