import sys
from pathlib import Path

# The recorder is used from the checkout (PYTHONPATH=python), not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
