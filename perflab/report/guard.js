/* Collects script errors and console errors before anything else runs (first in <head>), so the
   self-check (check.js) can count them. */
window.__reportErrors = [];
window.addEventListener("error", function (e) { window.__reportErrors.push(String(e.message || e)); });
(function () {
  var original = console.error;
  console.error = function () {
    window.__reportErrors.push(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
