"""The dataset root: file I/O, versions and LATEST, locks, the catalog."""
