"""Duplicates at commit: byte-identical copies from the catalog's sha256 (duplicates), and
near-duplicates from the writer's perceptual hashes (perceptual), grouped by an exact Hamming
join (near_duplicates over multi_index) and reported with the evaluation images that leak a
train image (leaks). The writer imports only perceptual; commit imports the rest."""
