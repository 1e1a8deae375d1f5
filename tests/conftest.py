import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:       # `spec` and the tests' helpers import from the checkout
    sys.path.insert(0, str(ROOT))
