/* Live admin pages (durable_agents.admin.live). Without JavaScript, or without
 * EventSource and fetch, the pages stay as they are: reload to see news.
 *
 * Run page: follows the run's Server-Sent Events (a staff-session view of the admin's own)
 * and, on each new record or status, fetches the page again and swaps in what changed: the
 * fields, the timeline and the panels. The "person is needed" banner is kept while someone
 * is typing in it.
 *
 * Approval queue: polls a small JSON list of pending calls and, when it changes, swaps in
 * the page's rows again (rows still on the page stay selected). */
(function () {
  "use strict";
  if (!window.fetch || !window.DOMParser) {
    return;
  }
  var REGIONS = ["da-needed", "da-operate", "da-lease", "da-approvals", "da-halts", "da-journal", "da-history"];

  function fetchPage(then) {
    return fetch(window.location.href, {credentials: "same-origin"})
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        then(new DOMParser().parseFromString(text, "text/html"));
      });
  }

  function adopt(node) {
    return document.importNode(node, true);
  }

  function editing(region) {
    var fields = region.querySelectorAll("textarea, input[type=text]");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i] === document.activeElement || fields[i].value !== fields[i].defaultValue) {
        return true;
      }
    }
    return false;
  }

  function place(fresh) {
    // A region the page did not have yet: after its previous sibling (or before its next)
    // that the page has.
    var before = fresh.previousElementSibling;
    while (before && !(before.id && document.getElementById(before.id))) {
      before = before.previousElementSibling;
    }
    if (before) {
      document.getElementById(before.id).after(adopt(fresh));
      return;
    }
    var after = fresh.nextElementSibling;
    while (after && !(after.id && document.getElementById(after.id))) {
      after = after.nextElementSibling;
    }
    if (after) {
      document.getElementById(after.id).before(adopt(fresh));
    }
  }

  function swapRun(doc) {
    var oldSets = document.querySelectorAll("#content-main fieldset.module");
    var newSets = doc.querySelectorAll("#content-main fieldset.module");
    if (oldSets.length === newSets.length) {
      oldSets.forEach(function (set, i) {
        set.replaceWith(adopt(newSets[i]));
      });
    }
    REGIONS.forEach(function (id) {
      var old = document.getElementById(id);
      var fresh = doc.getElementById(id);
      if (old && fresh) {
        if (!(id === "da-needed" && editing(old))) {
          old.replaceWith(adopt(fresh));
        }
      } else if (old) {
        if (!editing(old)) {
          old.remove();
        }
      } else if (fresh) {
        place(fresh);
      }
    });
  }

  function lastSeq() {
    var last = 0;
    document.querySelectorAll(".da-timeline > li[id^='seq-']").forEach(function (item) {
      last = Math.max(last, parseInt(item.id.slice(4), 10) || 0);
    });
    return last;
  }

  function followRun(live) {
    if (!window.EventSource) {
      return;
    }
    var busy = false;
    var again = false;
    function refresh() {
      if (busy) {
        again = true;
        return;
      }
      busy = true;
      fetchPage(swapRun)
        .catch(function () {})
        .then(function () {
          busy = false;
          live.dataset.refreshed = String((parseInt(live.dataset.refreshed, 10) || 0) + 1);
          if (again) {
            again = false;
            refresh();
          }
        });
    }
    var source = new EventSource(live.dataset.events + "?after=" + lastSeq());
    live.hidden = false;
    live.dataset.state = "live";
    source.addEventListener("record", refresh);
    source.addEventListener("status", function (event) {
      var status = JSON.parse(event.data).status;
      if (status !== live.dataset.status) { // the first event repeats what the page shows
        live.dataset.status = status;
        refresh();
      }
    });
    source.addEventListener("end", function () {
      source.close();
      live.dataset.state = "ended";
      live.textContent = "The run has ended; this page shows all of it.";
      refresh();
    });
  }

  function followQueue() {
    var url = new URL("pending.json", window.location.origin + window.location.pathname);
    var seen = null;
    function swapRows(doc) {
      // Rows only, when both pages have a table (Django's actions script keeps its hold on
      // the header and the action bar); the whole list when one of them is empty.
      var oldBody = document.querySelector("#result_list tbody");
      var freshBody = doc.querySelector("#result_list tbody");
      var old = oldBody && freshBody ? oldBody : document.getElementById("changelist-form");
      var fresh = oldBody && freshBody ? freshBody : doc.getElementById("changelist-form");
      if (!fresh || !old) {
        return;
      }
      var checked = {};
      old.querySelectorAll("input.action-select:checked").forEach(function (box) {
        checked[box.value] = true;
      });
      var adopted = adopt(fresh);
      adopted.querySelectorAll("input.action-select").forEach(function (box) {
        box.checked = !!checked[box.value];
      });
      old.replaceWith(adopted);
      var paginator = document.querySelector("#changelist-form .paginator");
      var freshPaginator = doc.querySelector("#changelist-form .paginator");
      if (paginator && freshPaginator) {
        paginator.replaceWith(adopt(freshPaginator));
      }
      var count = parseInt(document.body.dataset.daRefreshed, 10) || 0;
      document.body.dataset.daRefreshed = String(count + 1);
    }
    function poll() {
      fetch(url, {credentials: "same-origin"})
        .then(function (response) {
          return response.ok ? response.text() : null;
        })
        .then(function (text) {
          if (text === null) {
            return null;
          }
          var changed = seen !== null && text !== seen;
          seen = text;
          return changed ? fetchPage(swapRows) : null;
        })
        .catch(function () {})
        .then(function () {
          window.setTimeout(poll, 3000);
        });
    }
    poll();
  }

  function start() {
    var live = document.getElementById("da-live");
    if (live && live.dataset.events) {
      followRun(live);
    } else if (document.body.classList.contains("model-approvalrequest") &&
               document.body.classList.contains("change-list")) {
      followQueue();
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
