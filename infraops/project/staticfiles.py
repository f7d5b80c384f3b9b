"""Static files under names with their content's hash, compressed, when collected.

`manage.py prepare` (so every standalone start) runs collectstatic: each file gets a copy
named with its hash, and a gzip one beside it, which WhiteNoise serves with a year's
cache and `immutable`; a new version of a file is a new name, so no browser keeps a stale
one. Where nothing was collected (tests, benches, a dev server on a fresh checkout) a page
still renders: a file the manifest does not name keeps its plain name and WhiteNoise serves it
from the finders, uncached.
"""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class HashedStaticFiles(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        try:
            return str(super().stored_name(name))
        except ValueError:  # not in the manifest, or no manifest yet: the plain name
            return name
