/* Cell renderers the dashboard's AG Grids name in their column definitions ("cellRenderer"). */
var dagcomponentfuncs = (window.dashAgGridComponentFunctions =
  window.dashAgGridComponentFunctions || {});

/* A cell's value as text, linked to the dashboard path in the row's `<hrefField>` (see
   components/widgets.py link_column). Never markdown nor HTML: a job's name cannot become a
   link elsewhere. A href that is not a path of this site (`//host`, `/\host`, a scheme) is
   not linked. */
dagcomponentfuncs.TextLink = function (props) {
  var text = props.value === null || props.value === undefined ? "" : String(props.value);
  var href = props.data ? props.data[props.hrefField] : null;
  var local = typeof href === "string" && /^\/(?![\/\\])/.test(href);
  return React.createElement(local ? "a" : "span", local ? { href: href } : null, text);
};
