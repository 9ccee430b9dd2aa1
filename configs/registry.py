"""A registry of named extension points (advantage estimators, reward sources, DPO objectives): each
entry declared once, by name, with what the rest of the pipeline needs to know about it. The schema
validates a config's choice against it at load time, so an entry registered later (a test's, a
plugin's) is accepted at once. No torch here: the schema imports it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_core import PydanticKnownError, core_schema


class Registry(dict):
    """`{name: entry}`, each entry a frozen dataclass with a `name` and an `about`. As the metadata of a
    `str` field (`Annotated[str, ESTIMATORS]`) it admits only its names, with pydantic's one-line
    message for a wrong Literal."""

    def __init__(self, kind: str, entries: Iterable[Any] = ()):
        super().__init__()
        self.kind = kind
        for entry in entries:
            if entry.name in self:
                raise ValueError(f"{kind} {entry.name!r} is declared twice")
            self[entry.name] = entry

    def expected(self) -> str:
        """`'a', 'b' or 'c'`, as pydantic lists a Literal's values."""
        names = [repr(name) for name in self]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

    def check(self, name: str) -> str:
        if name not in self:
            raise PydanticKnownError("literal_error", {"expected": self.expected()})
        return name

    def described(self) -> str:
        """`name: what it is; ...` for a field's description."""
        return "; ".join(f"{name}: {entry.about}" if entry.about else name for name, entry in self.items())

    def __get_pydantic_core_schema__(self, source, handler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))
