"""Tool definitions, the per-call security chain and the builtin tools."""
