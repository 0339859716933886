"""What every part of the suite shares, with no torch: the ablation registry and names (`names`), the
settings of a config (`config`), where outputs go (`layout`), cell identity, metrics files and atomic
writes. `patches`, `localrl`, `verlrun`, `analysis` and the workflow may all import it."""
