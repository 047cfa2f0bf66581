"""Demo models shipped with SIE (small, committed artifacts; regenerate with each package's train script)."""
