/* Functions the dashboard's AG Grids name in their column definitions ({"function": "<name>"}).
   dash-ag-grid evaluates a comparator's string once, so it must name a function defined here:
   an inline expression is silently ignored and the column sorts as text. */
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});

/* Rows in the order of their numeric `id` (a column whose cells show a link, not the number). */
dagfuncs.byNumericId = function (valueA, valueB, nodeA, nodeB) {
  return nodeA.data.id - nodeB.data.id;
};
