"""placeholder: filled by its own issue."""
