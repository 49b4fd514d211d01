"""Page tests need Playwright for Python (pip, the `test` extra) and Debian's chromium (apt).
Without Playwright they are left out of collection rather than failing on import; without
chromium they skip (tests/web/chromium.py)."""

import importlib.util

collect_ignore = (
    [] if importlib.util.find_spec("playwright") else ["chromium.py", "test_demo_page.py"]
)
