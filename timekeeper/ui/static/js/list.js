// The namespace list: every namespace the identity may read, sortable and filterable (on a fleet's hub, a
// member cluster's namespace shows its cluster before its name, and each cluster has its totals). Each row is built
// once per load, the first screenful before the first paint and the rest in slices between frames; sorting
// and filtering only reorder the same row elements. The list is an ARIA table of CSS grid
// rows in groups of CHUNK, each group `content-visibility: auto`: the browser lays out and paints only the
// groups on screen, so 1,000 namespaces cost about what 50 do, while every row stays in the document (find
// in page, screen readers). A <table> cannot do this: its rows are laid out together.

import { api, ApiError } from "./api.js";
import { h } from "./dom.js";
import { exhaustedModels, gpuMinutes, LOCAL_CLUSTER, pct, placeOf, relative, STATE_LABELS } from "./format.js";

const STATE_ORDER = { exhausted: 0, warning: 1, in_budget: 2, unlimited: 3 };
const CHUNK = 50;
const FIRST_GROUPS = 2; // built before the first paint: more than a screenful
const SLICE_MS = 8; // the background build yields to the browser this often
const collator = new Intl.Collator(undefined, { numeric: true });

function usedFraction(ns) {
  const allowance = ns.budget_gpu_minutes === null ? null : ns.budget_gpu_minutes + ns.granted_gpu_minutes;
  if (allowance === null) return null;
  if (allowance <= 0) return ns.used_gpu_minutes > 0 ? 1 : 0;
  return ns.used_gpu_minutes / allowance;
}

function exhaustsAt(ns) {
  if (ns.remaining_gpu_minutes !== null && ns.remaining_gpu_minutes <= 0) return Number.MIN_SAFE_INTEGER; // spent: first
  const at = ns.forecast && ns.forecast.exhausts_at;
  return at ? new Date(at).getTime() : null;
}

function burnRate(ns) {
  return ns.forecast ? ns.forecast.burn_rate_gpu_minutes_per_hour : null;
}

/** The name the list filters by: `cluster/namespace` for a member's, the bare name locally. */
function shownName(ns) {
  const { cluster, name } = placeOf(ns);
  return cluster ? `${cluster}/${name}` : name;
}

/** How names sort: by cluster, the local one ("") first, then by name (a blank sorts before any character
 * of a cluster's name, a DNS label). */
function nameOrder(ns) {
  const { cluster, name } = placeOf(ns);
  return `${cluster} ${name}`;
}

// Each column: its heading, how it sorts (a number or a string; null sorts last), how a cell shows it.
const COLUMNS = [
  { key: "namespace", label: "Namespace", sort: nameOrder },
  { key: "state", label: "State", sort: (ns) => STATE_ORDER[ns.state] ?? 9 },
  { key: "budget", label: "Budget", numeric: true, sort: (ns) => ns.budget_gpu_minutes },
  { key: "used", label: "Used", numeric: true, sort: (ns) => ns.used_gpu_minutes },
  { key: "remaining", label: "Remaining", numeric: true, sort: (ns) => ns.remaining_gpu_minutes },
  { key: "fraction", label: "Used %", numeric: true, sort: usedFraction },
  { key: "forecast", label: "Runs out", sort: exhaustsAt },
  { key: "rate", label: "Burn / h", numeric: true, sort: burnRate },
  { key: "priority", label: "Priority class", sort: (ns) => ns.priority_class },
];

function stateBadge(state) {
  return h("span", { class: `badge state-${state}` }, STATE_LABELS[state] || state);
}

/** Beside the name: how many of the namespace's model budgets are spent, naming them (its total may be in
 * budget while one model is not); nothing without an exhausted model. */
function modelMarker(ns) {
  const models = exhaustedModels(ns);
  if (!models.length) return null;
  const names = models.join(", ");
  return h(
    "span",
    { class: "badge state-exhausted model-marker", title: `Exhausted models: ${names}` },
    models.length === 1 ? "1 model exhausted" : `${models.length} models exhausted`,
  );
}

function forecastCell(ns, now) {
  if (ns.remaining_gpu_minutes !== null && ns.remaining_gpu_minutes <= 0) {
    return h("div", { role: "cell" }, "already spent");
  }
  if (!ns.forecast) return h("div", { role: "cell", class: "muted" }, "—");
  const at = ns.forecast.exhausts_at;
  if (!at) return h("div", { role: "cell", class: "muted" }, "not this period");
  return h("div", { role: "cell" }, h("time", { datetime: at, title: new Date(at).toString() }, relative(at, now)));
}

/** The row's heading: a local namespace links to its page; a member cluster's shows its cluster first, and
 * no link (the API's namespace paths name the caller's own cluster's namespaces). */
function nameCell(ns) {
  const { cluster, name } = placeOf(ns);
  const shown = cluster
    ? [h("span", { class: "cluster", title: `cluster ${cluster}` }, `${cluster} / `), h("span", {}, name)]
    : [h("a", { href: `#/ns/${encodeURIComponent(name)}` }, name)];
  return h("div", { role: "rowheader" }, ...shown, modelMarker(ns));
}

/** Per cluster and in all: namespaces and GPU-minutes used; null without a member cluster's namespace (the
 * summary says it all). */
function clusterTotals(namespaces) {
  const totals = new Map();
  for (const ns of namespaces) {
    const { cluster } = placeOf(ns);
    const total = totals.get(cluster) || { count: 0, used: 0 };
    total.count += 1;
    total.used += ns.used_gpu_minutes;
    totals.set(cluster, total);
  }
  if (![...totals.keys()].some((cluster) => cluster)) return null;
  const names = [...totals.keys()].sort(collator.compare);
  const used = namespaces.reduce((sum, ns) => sum + ns.used_gpu_minutes, 0);
  const part = (label, total, attrs) =>
    h("li", attrs, h("strong", {}, label), ` ${total.count.toLocaleString()} namespace${total.count === 1 ? "" : "s"}, ${gpuMinutes(total.used)} GPU-minutes used`);
  return h(
    "ul",
    { class: "cluster-totals", id: "list-clusters", "aria-label": "Namespaces and GPU-minutes used per cluster, and in all" },
    ...names.map((name) => part(name || LOCAL_CLUSTER, totals.get(name), { dataset: { cluster: name } })),
    part("All clusters", { count: namespaces.length, used }, { class: "all" }),
  );
}

function row(ns, now) {
  const fraction = usedFraction(ns);
  return h(
    "div",
    { role: "row", class: "grid-row", dataset: { namespace: ns.namespace, cluster: placeOf(ns).cluster, state: ns.state } },
    nameCell(ns),
    h("div", { role: "cell" }, stateBadge(ns.state)),
    h("div", { role: "cell", class: "num" }, ns.budget_gpu_minutes === null ? "unlimited" : gpuMinutes(ns.budget_gpu_minutes)),
    h("div", { role: "cell", class: "num" }, gpuMinutes(ns.used_gpu_minutes)),
    h("div", { role: "cell", class: "num" }, gpuMinutes(ns.remaining_gpu_minutes)),
    h("div", { role: "cell", class: "num" }, fraction === null ? "—" : pct(fraction * 100)),
    forecastCell(ns, now),
    h("div", { role: "cell", class: "num" }, ns.forecast ? gpuMinutes(burnRate(ns)) : "—"),
    h("div", { role: "cell", class: "mono" }, ns.priority_class),
  );
}

function compare(column, direction) {
  return (a, b) => {
    const x = column.sort(a.ns);
    const y = column.sort(b.ns);
    // Missing values (unlimited budgets, no forecast) sort last whichever the direction.
    if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1;
    if (y === null || y === undefined) return -1;
    const order = typeof x === "string" ? collator.compare(x, y) : x - y;
    return order ? order * direction : collator.compare(nameOrder(a.ns), nameOrder(b.ns));
  };
}

function openForm(navigate) {
  const input = h("input", {
    id: "open-namespace",
    name: "namespace",
    required: true,
    pattern: "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    maxlength: 63,
    autocomplete: "off",
    spellcheck: "false",
  });
  return h(
    "form",
    {
      class: "inline-form",
      "aria-label": "Open a namespace by name",
      onsubmit: (event) => {
        event.preventDefault();
        if (input.reportValidity()) navigate(`#/ns/${encodeURIComponent(input.value.trim())}`);
      },
    },
    h("label", { for: "open-namespace" }, "Open a namespace"),
    input,
    h("button", { type: "submit" }, "Open"),
  );
}

export async function renderList(view, ctx) {
  performance.clearMarks("gtk:list:start");
  performance.clearMarks("gtk:list:fetched");
  performance.clearMarks("gtk:list:painted");
  performance.clearMarks("gtk:list:complete");
  performance.clearMeasures("gtk:list:complete");
  performance.clearMeasures("gtk:list");
  performance.clearMeasures("gtk:list:render");
  performance.clearMeasures("gtk:list:page");
  performance.mark("gtk:list:start");
  const heading = h("h1", {}, "Namespaces");
  view.replaceChildren(heading, openForm(ctx.navigate));
  ctx.status("Loading namespaces…");
  let namespaces;
  try {
    namespaces = await api.namespaces();
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      ctx.status("");
      view.append(
        h(
          "p",
          { class: "notice", id: "list-forbidden" },
          `${ctx.who.name} may not list every namespace. Open the namespace you may read by its name above.`,
        ),
      );
      return;
    }
    throw error;
  }
  performance.mark("gtk:list:fetched");
  const now = ctx.now();
  const entries = namespaces.map((ns) => ({ ns, tr: null }));
  const rowOf = (entry) => entry.tr || (entry.tr = row(entry.ns, now));

  const counts = {};
  for (const ns of namespaces) counts[ns.state] = (counts[ns.state] || 0) + 1;
  const summary = h(
    "p",
    { class: "summary", id: "list-summary" },
    `${namespaces.length.toLocaleString()} namespaces`,
    ...Object.keys(STATE_ORDER)
      .filter((state) => counts[state])
      .map((state) => [" · ", stateBadge(state), ` ${counts[state].toLocaleString()}`]),
  );

  const filterInput = h("input", {
    type: "search",
    id: "filter-name",
    autocomplete: "off",
    spellcheck: "false",
    "aria-controls": "namespaces",
  });
  const stateSelect = h(
    "select",
    { id: "filter-state", "aria-controls": "namespaces" },
    h("option", { value: "" }, "Every state"),
    ...Object.keys(STATE_ORDER).map((state) => h("option", { value: state }, STATE_LABELS[state])),
  );
  const shown = h("p", { id: "list-shown", role: "status", "aria-live": "polite", class: "muted" });
  const units = h("p", { class: "muted", id: "list-units" }, "Budget, used, remaining and burn in GPU-minutes this period (burn: per hour, over the forecast window).");
  const filters = h(
    "div",
    { class: "filters" },
    h("label", { for: "filter-name" }, "Filter by name"),
    filterInput,
    h("label", { for: "filter-state" }, "State"),
    stateSelect,
  );

  let sortColumn = COLUMNS[0];
  let direction = 1;
  const headerCells = COLUMNS.map((column) => {
    const button = h(
      "button",
      { type: "button", class: "sort", dataset: { sort: column.key }, onclick: () => sortBy(column) },
      column.label,
    );
    return h("div", { role: "columnheader", class: column.numeric ? "num" : null, "aria-sort": "none" }, button);
  });
  const head = h("div", { role: "rowgroup", class: "grid-head" }, h("div", { role: "row", class: "grid-row" }, headerCells));
  const table = h(
    "div",
    {
      role: "table",
      id: "namespaces",
      class: "grid-table",
      "aria-label": "Namespaces and their budgets; the column buttons sort",
      "aria-describedby": "list-units",
    },
    head,
  );

  let generation = 0;
  let firstComplete = true;

  function complete() {
    table.setAttribute("aria-busy", "false");
    document.body.dataset.listComplete = "true";
    if (firstComplete) {
      firstComplete = false;
      performance.mark("gtk:list:complete");
      performance.measure("gtk:list:complete", "gtk:list:fetched", "gtk:list:complete");
    }
  }

  /** Builds the rows of the groups still empty, a slice at a time; a newer apply() stops it. */
  function fill(pending, mine) {
    if (mine !== generation) return;
    const started = performance.now();
    while (pending.length && performance.now() - started < SLICE_MS) {
      const group = pending.shift();
      group.append(...group.entries.map(rowOf));
    }
    if (pending.length) setTimeout(() => fill(pending, mine), 0);
    else complete();
  }

  function apply() {
    generation += 1;
    const mine = generation;
    document.body.dataset.listComplete = "false";
    table.setAttribute("aria-busy", "true");
    const text = filterInput.value.trim().toLowerCase();
    const state = stateSelect.value;
    const sorted = entries.slice().sort(compare(sortColumn, direction));
    const visible = sorted.filter(
      (e) => (!text || shownName(e.ns).includes(text)) && (!state || e.ns.state === state),
    );
    const groups = [];
    for (let i = 0; i < visible.length; i += CHUNK) {
      const group = h("div", { role: "rowgroup", class: "chunk" });
      group.entries = visible.slice(i, i + CHUNK);
      groups.push(group);
    }
    const pending = groups.slice();
    for (const group of pending.splice(0, FIRST_GROUPS)) group.append(...group.entries.map(rowOf));
    // The header stays in place (re-inserting it would take the keyboard focus off its sort button).
    for (const old of [...table.children]) if (old !== head) old.remove();
    table.append(...groups);
    table.setAttribute("aria-rowcount", String(visible.length + 1));
    shown.textContent =
      visible.length === entries.length
        ? `Showing all ${entries.length.toLocaleString()}`
        : `Showing ${visible.length.toLocaleString()} of ${entries.length.toLocaleString()}`;
    COLUMNS.forEach((column, i) => {
      headerCells[i].setAttribute(
        "aria-sort",
        column === sortColumn ? (direction > 0 ? "ascending" : "descending") : "none",
      );
    });
    if (pending.length) setTimeout(() => fill(pending, mine), 0);
    else complete();
  }

  function sortBy(column) {
    direction = column === sortColumn ? -direction : 1;
    sortColumn = column;
    apply();
  }

  let pending = 0;
  const schedule = () => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(apply);
  };
  filterInput.addEventListener("input", schedule);
  stateSelect.addEventListener("input", schedule);
  stateSelect.addEventListener("change", schedule);

  apply();
  const byCluster = clusterTotals(namespaces);
  view.append(summary, ...(byCluster ? [byCluster] : []), filters, h("div", { class: "list-notes" }, shown, units), h("div", { class: "table-scroll" }, table));
  ctx.status("");
  // Painted: the frame after this one has been laid out and drawn.
  requestAnimationFrame(() =>
    setTimeout(() => {
      performance.mark("gtk:list:painted");
      // From the request for the list, and from the page's navigation (meaningful on a fresh load).
      performance.measure("gtk:list", "gtk:list:start", "gtk:list:painted");
      performance.measure("gtk:list:page", { start: 0, end: "gtk:list:painted" });
      performance.measure("gtk:list:render", "gtk:list:fetched", "gtk:list:painted");
      document.body.dataset.listPainted = "true";
    }, 0),
  );
}
