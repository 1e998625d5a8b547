/* The shared library is the whole static core (linked as a whole archive); this file only gives the
 * target a source of its own. */
typedef int tl_export_anchor_unused;
