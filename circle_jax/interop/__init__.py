"""Other runtimes, driven from circle-jax: the installed onert wheel (checkpoint layout
probing, step-by-step peer training). Library code reaches a peer only through here."""
