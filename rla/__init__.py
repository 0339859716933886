"""What every part of the suite shares, with no torch: file writing, cell identity (and, later, names
and settings). `patches`, `localrl`, `verlrun`, `analysis` and the workflow may all import it."""
