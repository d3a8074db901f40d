"""pytest's detailed assertion messages in the shared helper modules too (they are not test
modules, so pytest would not rewrite their asserts otherwise)."""

import pytest

pytest.register_assert_rewrite("tests.bubble_rows", "tests.dist", "tests.hta_check", "tests.kineto")
