"""SIE's example specs and demo models, shipped as package data (``sie.examples``) so that ``sie demo``
runs from an installed SIE; specs name their artifacts and modules relative to their own location."""
