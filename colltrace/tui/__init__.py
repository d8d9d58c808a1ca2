"""The terminal UI: colltrace.tui.model computes what to draw (no Textual), colltrace.tui.app draws it."""
