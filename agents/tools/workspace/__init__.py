"""Workspace tools: list, read and search the run's git worktree; edit a file or apply a
diff under the boundary of docs/product.md ("Git"), enforced through ``reviews.diff_policy``;
show the run's diff and revert a file or the last edit.

One module per tool family, and the helpers they share:

- ``reading``: ``list_files``, ``read_file``;
- ``search``: ``search_code`` (the pattern checks and the time limit);
- ``editing``: ``edit_file``, ``apply_diff``;
- ``changes``: ``show_diff``, ``revert`` (a file back to the base commit, or the last write
  undone);
- ``worktree``: paths resolved under the boundary, the repository's files, a file's state;
- ``diffs``: the run's diff against the base commit, its counts and the cap's verdict;
- ``guard``: a write checked as git really wrote it, put back when it breaks the boundary;
- ``journal``: the one-level undo journal;
- ``syntax``: the syntax check of the Python files a write left.

Contracts:

* File contents come back verbatim as data: nothing read from the repository is ever
  interpreted here (the LLM policy marks it untrusted for the model). A Python file an edit
  writes is compiled to check its syntax, never imported or run.
* A refusal by the boundary leaves the worktree exactly as it was.
* Every successful write (edit_file, apply_diff, revert of a file) first saves what its files
  held into a one-level undo journal in the worktree's private git dir (never in the work
  tree, so never in the diff or a commit); ``revert`` with ``last_edit`` plays it back.
* Nothing here imports a Django model: the tools work on any git worktree.
* A module's constants (``search.SEARCH_SECONDS``, ``syntax.SYNTAX_MAX_BYTES``...) are read
  where they are defined, and are not re-exported here: setting one on this package would
  change nothing.
"""

from __future__ import annotations

# The tool families register their tools as they are imported, and the registry's order is the
# order the model reads the tools in: keep these imports in this order (isort would sort them).
# isort: off
from agents.tools.workspace import reading  # noqa: F401  (list_files, read_file)
from agents.tools.workspace import search  # noqa: F401  (search_code)
from agents.tools.workspace import editing  # noqa: F401  (edit_file, apply_diff)
from agents.tools.workspace import changes  # noqa: F401  (show_diff, revert)
# isort: on
from agents.tools.base import Refused
from agents.tools.workspace.diffs import _worktree_diff
from agents.tools.workspace.guard import _reverted_unless_safe

__all__ = ["Refused", "_reverted_unless_safe", "_worktree_diff"]
