"""The error of a bad field, shared by every config and record that checks its fields.

A config's ``__post_init__`` (``optim.config``, ``optim.plan``, fsobs's job and run-format
records) raises :class:`FieldError` naming the field it refused, so that a reader that builds
the config from JSON (``fsobs.runformat.structs.convert``) can say which field of which file was
bad without reading the message: ``FieldError("window", "must be an int >= 1, got 0")`` inside
``freescale.balance`` becomes ``FieldError("freescale.balance.window", ...)``
(:meth:`FieldError.within`). Standard library only.
"""

from __future__ import annotations


class FieldError(ValueError):
    """A bad field: ``field`` names it (dotted when nested, ``balance.window``; empty: the whole
    value), ``reason`` says what is wrong with it; the message is ``field: reason``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field, self.reason = field, reason

    def within(self, parent: str) -> FieldError:
        """The same error, its field named from ``parent`` (the field that holds this one)."""
        if not parent:
            return self
        return FieldError(f"{parent}.{self.field}" if self.field else parent, self.reason)

    def __reduce__(self) -> tuple[object, ...]:  # keep field and reason across process pools
        return (FieldError, (self.field, self.reason))
