"""The analysis layer: reads run tables (never backends, never the sweep) and computes every
number the book states, once. Chapters and plots only read what these modules return."""
