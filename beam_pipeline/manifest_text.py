"""A published version's manifest as text lines: what the build's summary
(launcher/report.py) and tools/inspect_dataset.py both print, below both of them."""


def class_table(manifest, splits, all_column=False):
    """Examples per class and split, as indented text lines, with a total row."""
    labels = list(manifest.get("labels", []))
    width = max([len(l) for l in labels] + [len("total"), len("class")])

    def line(name, row):
        return ("  " + name.ljust(width) + "".join(f"{n:>12}" for n in row)
                + (f"{sum(row):>12}" if all_column else ""))

    header = "  " + "class".ljust(width) + "".join(f"{s:>12}" for s in splits)
    lines = [header + (f"{'all':>12}" if all_column else "")]
    for label in labels:
        lines.append(line(label, [manifest["splits"][s].get("label_counts", {}).get(label, 0)
                                  for s in splits]))
    lines.append(line("total", [manifest["splits"][s]["num_examples"] for s in splits]))
    return lines


def near_duplicates_line(manifest):
    """One line on near-duplicates (None when the version was built without them)."""
    near = manifest.get("near_duplicates")
    if not near:
        return None
    if "pairs" not in near:  # a version from before pairs were confirmed
        return (f"near-duplicates (pHash within {near['radius']} bits, unconfirmed): "
                f"{near['groups']} group(s); rebuild to confirm them")
    line = (f"near-duplicates (pHash within {near['radius']} bits, confirmed by the "
            f"descriptor): {near['pairs']} pair(s) of {near['candidates']} candidates, "
            f"{near['pairs_across_splits']} across splits, {near['leaks']} evaluation "
            f"image(s) paired with a train image")
    line += f", {near['excluded']} left out" if near["excluded"] else ""
    exact = near.get("exact_radius", near["radius"])
    if exact < near["radius"]:  # a multi-probe search (many images): say what it may miss
        line += (f"; exact within {exact} bits, pairs {near['radius']} bits apart found "
                 f"~{near['found_at_radius']:.0%} of the time")
    return line
