// MathJax 3 (served from the site itself: assets/mathjax/tex-svg-full.js, copied by docs/_hooks.py).
// Equations come from pymdownx.arithmatex (class "arithmatex", generic mode: \( \) and \[ \]) on the
// pages and the docstrings, and from the notebooks' Markdown cells ($...$).
//
// SVG output: every glyph is a path inside its own equation (fontCache "local"), so there are no web
// fonts to fetch (none to miss offline, under file:// or a sub-path) and no cache shared between
// typesets that a later typeset could empty.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  svg: {fontCache: "local"},
  // Inside Material's header, page container and dialog only the arithmatex elements and the
  // notebooks' Markdown are searched for math. (Not ignoreHtmlClass ".*|": that also matches an
  // element without a class, so inside a notebook cell the $...$ of every <p> or <li> was skipped.)
  options: {
    ignoreHtmlClass: "md-header|md-container|md-dialog",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown|jp-MarkdownOutput|jp-RenderedHTMLCommon",
  },
};
// MathJax typesets the page it is loaded on by itself (startup). Material's document$ replays that
// page to a new subscriber and then emits once per page swapped in by instant navigation (if that
// feature is on); only those later pages are typeset here, once MathJax's startup is done.
// Never call MathJax.startup.output.clearCache() here: with the CHTML output it drops the CSS rules
// that draw the characters already on the page, and the equations typeset at startup went blank
// (the containers kept their boxes, the glyphs were gone).
if (typeof document$ !== "undefined") {
  let first = true;
  document$.subscribe(() => {
    if (first) {
      first = false;
      return;
    }
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      // (not assigned back to startup.promise: typesetPromise chains itself onto it)
      MathJax.startup.promise.then(() => {
        MathJax.typesetClear();  // forget the equations of the page swapped out
        MathJax.texReset();  // equation numbers and labels start afresh
        return MathJax.typesetPromise();
      });
    }
  });
}
