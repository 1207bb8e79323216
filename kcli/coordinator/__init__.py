"""The coordinators, as Kafka's ``coordinator`` modules: consumer groups and committed offsets
(``group``), transactions (``transaction``), and which live broker coordinates a key
(``placement``). They act on the broker through the narrow calls their constructors take."""
