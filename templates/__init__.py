"""Job spec templates for `elfes init` (shipped inside the installed package as elfes.launcher.templates)."""
