import sys
from pathlib import Path

# The recorder is used from the checkout (PYTHONPATH=python), not installed;
# appended, so the installed `dtr` package (with its extension) comes first.
sys.path.append(str(Path(__file__).resolve().parents[1]))
