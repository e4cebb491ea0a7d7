// One namespace: its budget and forecast, the burn-down chart, where the minutes went (by pod and by day,
// with efficiency figures where the sidecars measured them), and for those who may administer it the
// forms to set its budget and grant minutes, its grants and its audit trail.

import { api, ApiError } from "./api.js";
import { burnDown } from "./chart.js";
import { h } from "./dom.js";
import { bytes, dateTime, gpuMinutes, joules, pct, relative, STATE_LABELS } from "./format.js";

const MODEL_POLICIES = {
  reduce: "the reduced class",
  steer: "steered off the exhausted models",
};

function field(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

function summary(budget, now) {
  const f = budget.forecast;
  let forecast = "—";
  if (budget.remaining_gpu_minutes !== null && budget.remaining_gpu_minutes <= 0) {
    forecast = "already spent";
  } else if (f) {
    forecast = f.exhausts_at
      ? h("span", {}, h("time", { datetime: f.exhausts_at }, dateTime(f.exhausts_at)), ` (${relative(f.exhausts_at, now)})`)
      : "not this period";
  }
  const period = budget.period;
  return h(
    "dl",
    { class: "facts", id: "budget-facts" },
    field("State", h("span", { class: `badge state-${budget.state}`, id: "ns-state" }, STATE_LABELS[budget.state] || budget.state)),
    field("Budget", budget.budget_gpu_minutes === null ? "unlimited" : `${gpuMinutes(budget.budget_gpu_minutes)} GPU-min`),
    field("Granted this period", `${gpuMinutes(budget.granted_gpu_minutes)} GPU-min`),
    field("Used", `${gpuMinutes(budget.used_gpu_minutes)} GPU-min`),
    field("Remaining", h("span", { id: "ns-remaining" }, budget.remaining_gpu_minutes === null ? "unlimited" : `${gpuMinutes(budget.remaining_gpu_minutes)} GPU-min`)),
    field("Period", `${period.kind}${period.start ? `, ${dateTime(period.start)} – ${dateTime(period.end)}` : ""}`),
    field("Runs out", forecast),
    field("Burn rate", f ? `${gpuMinutes(f.burn_rate_gpu_minutes_per_hour)} GPU-min/h over the last ${f.window_minutes} min` : "—"),
    field("Priority class", h("code", {}, budget.priority_class)),
    field("Budget from", budget.source === "namespace" ? "its own budget" : "the cluster default"),
  );
}

/** Each GPU model's own budget (the answer's `models`), under the total's facts; nothing without one. */
function modelBudgets(budget, now) {
  const models = Object.entries(budget.models || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (!models.length) return null;
  const numeric = (value) => h("td", { class: "num" }, value);
  const runsOut = (m) => {
    if (m.remaining_gpu_minutes !== null && m.remaining_gpu_minutes <= 0) return "already spent";
    const at = m.forecast && m.forecast.exhausts_at;
    return at ? h("time", { datetime: at }, relative(at, now)) : "not this period";
  };
  const policy = budget.model_policy || "reduce";
  return h(
    "section",
    { "aria-labelledby": "models-title" },
    h("h2", { id: "models-title" }, "Budgets per GPU model"),
    h(
      "p",
      { class: "muted", id: "model-policy" },
      `A pod that could land on an exhausted model gets ${MODEL_POLICIES[policy] || policy} (${policy}). `,
      `GPU-minutes on a model that could not be known, counted against the total only: ${gpuMinutes(budget.unknown_model_used_gpu_minutes ?? 0)}.`,
    ),
    h(
      "div",
      { class: "table-scroll" },
      h(
        "table",
        { class: "data", id: "model-budgets" },
        h("caption", {}, "GPU-minutes this period per GPU model; each also counts against the total"),
        h("thead", {}, h("tr", {}, ["Model", "State", "Budget", "Used", "Remaining", "Runs out"].map((l, i) => h("th", { scope: "col", class: i >= 2 && i <= 4 ? "num" : null }, l)))),
        h(
          "tbody",
          {},
          models.map(([model, m]) =>
            h(
              "tr",
              { dataset: { model, state: m.state } },
              h("th", { scope: "row", class: "mono" }, model),
              h("td", {}, h("span", { class: `badge state-${m.state}` }, STATE_LABELS[m.state] || m.state)),
              numeric(m.budget_gpu_minutes === null ? "unlimited" : gpuMinutes(m.budget_gpu_minutes)),
              numeric(gpuMinutes(m.used_gpu_minutes)),
              numeric(gpuMinutes(m.remaining_gpu_minutes)),
              h("td", {}, runsOut(m)),
            ),
          ),
        ),
      ),
    ),
  );
}

function usageTable(id, caption, keyLabel, usage) {
  const efficiency = usage.rows.some((r) => r.mean_sm_util_pct !== null || r.mean_mem_used_bytes !== null || r.energy_joules !== null);
  const head = [keyLabel, "GPU-minutes", "Reports"];
  if (efficiency) head.push("Mean SM util", "Peak SM util", "Mean memory", "Peak memory", "Energy");
  const numeric = (value) => h("td", { class: "num" }, value);
  // A row's measured figures, or the totals' (the same names behind "total_").
  const figures = (source, prefix = "") =>
    efficiency && [
      numeric(pct(source[`${prefix}mean_sm_util_pct`])),
      numeric(pct(source[`${prefix}peak_sm_util_pct`])),
      numeric(bytes(source[`${prefix}mean_mem_used_bytes`])),
      numeric(bytes(source[`${prefix}peak_mem_used_bytes`])),
      numeric(joules(source[`${prefix}energy_joules`])),
    ];
  const rows = usage.rows.map((r) =>
    h(
      "tr",
      {},
      h("th", { scope: "row" }, r.key),
      numeric(gpuMinutes(r.gpu_minutes)),
      numeric(r.reports.toLocaleString()),
      figures(r),
    ),
  );
  if (!rows.length) return h("p", { class: "muted", id }, "No usage this period.");
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      { class: "data", id },
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, head.map((label, i) => h("th", { scope: "col", class: i ? "num" : null }, label)))),
      h("tbody", {}, rows),
      h(
        "tfoot",
        {},
        h(
          "tr",
          {},
          h("th", { scope: "row" }, "Total"),
          numeric(gpuMinutes(usage.total_gpu_minutes)),
          numeric(""),
          figures(usage, "total_"),
        ),
      ),
    ),
  );
}

function compactJson(value) {
  return value === null || value === undefined ? "—" : JSON.stringify(value);
}

export function auditTable(entries, id = "audit") {
  if (!entries.length) return h("p", { class: "muted", id }, "No changes recorded.");
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      { class: "data audit", id },
      h("caption", {}, "Newest first"),
      h("thead", {}, h("tr", {}, ["When", "Who", "Action", "Namespace", "Before", "After"].map((l) => h("th", { scope: "col" }, l)))),
      h(
        "tbody",
        {},
        entries.map((e) =>
          h(
            "tr",
            {},
            h("td", {}, h("time", { datetime: e.at }, dateTime(e.at))),
            // A member cluster's actor is not the hub's of the same name (docs/fleet.md).
            h("td", {}, e.actor_cluster ? `${e.actor} (${e.actor_cluster})` : e.actor),
            h("td", {}, h("code", {}, e.action)),
            h("td", {}, e.namespace || "(default)"),
            h("td", {}, h("code", { class: "json" }, compactJson(e.old_value))),
            h("td", {}, h("code", { class: "json" }, compactJson(e.new_value))),
          ),
        ),
      ),
    ),
  );
}

const GRANT_STATUS = { active: "Active", expired: "Expired", revoked: "Revoked", lapsed: "Lapsed" };

/** This period's and earlier grants (GET .../grants, newest first); admins may revoke an active one. */
function grantsTable(grants, mayAdminister, revoke) {
  if (!grants.length) return h("p", { class: "muted", id: "grants" }, "No grants.");
  const head = ["Granted", "By", "GPU-minutes", "Reason", "Status", "Expires"];
  if (mayAdminister) head.push(h("span", { class: "visually-hidden" }, "Actions"));
  return h(
    "div",
    { class: "table-scroll" },
    h(
      "table",
      { class: "data", id: "grants" },
      h("caption", {}, "Grants, newest first"),
      h("thead", {}, h("tr", {}, head.map((l, i) => h("th", { scope: "col", class: i === 2 ? "num" : null }, l)))),
      h(
        "tbody",
        {},
        grants.map((g) =>
          h(
            "tr",
            { dataset: { grant: String(g.id), status: g.status } },
            h("td", {}, h("time", { datetime: g.granted_at }, dateTime(g.granted_at))),
            h("td", {}, g.granted_by),
            h("td", { class: "num" }, gpuMinutes(g.gpu_minutes)),
            h("td", {}, g.reason),
            h("td", {}, GRANT_STATUS[g.status] || g.status, g.revoked_by ? ` by ${g.revoked_by}` : ""),
            h("td", {}, g.expires_at ? h("time", { datetime: g.expires_at }, dateTime(g.expires_at)) : "—"),
            mayAdminister &&
              h(
                "td",
                {},
                g.status === "active" &&
                  h(
                    "button",
                    {
                      type: "button",
                      class: "secondary revoke",
                      "aria-label": `Revoke the grant of ${gpuMinutes(g.gpu_minutes)} GPU-minutes (${g.reason})`,
                      onclick: () => revoke(g),
                    },
                    "Revoke",
                  ),
              ),
          ),
        ),
      ),
    ),
  );
}

function input(id, label, attrs, help) {
  const helpId = help ? `${id}-help` : null;
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, label),
    h("input", { id, name: id, "aria-describedby": helpId, ...attrs }),
    help && h("p", { class: "help", id: helpId }, help),
  );
}

/** A form whose submit runs `action(form)`; its errors are announced in the form itself. */
function adminForm(id, title, fields, submitLabel, action) {
  const error = h("p", { class: "form-error", id: `${id}-error`, role: "alert" });
  const submit = h("button", { type: "submit" }, submitLabel);
  const form = h(
    "form",
    {
      id,
      class: "admin-form",
      "aria-labelledby": `${id}-title`,
      "aria-describedby": `${id}-error`,
      novalidate: false,
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = "";
        if (!form.reportValidity()) return;
        submit.disabled = true;
        try {
          await action(form);
        } catch (failure) {
          error.textContent = failure instanceof ApiError ? failure.message : String(failure);
          submit.disabled = false;
        }
      },
    },
    h("h3", { id: `${id}-title` }, title),
    fields,
    submit,
    error,
  );
  return form;
}

function optionalNumber(form, name) {
  const value = form.elements[name].value.trim();
  return value === "" ? null : value;
}

function adminSection(ns, budget, ctx, reload) {
  const grant = adminForm(
    "grant-form",
    "Grant minutes",
    [
      input("grant-minutes", "GPU-minutes", { type: "number", min: "0.000000001", step: "any", required: true, inputmode: "decimal" }),
      input("grant-reason", "Reason", { type: "text", required: true, maxlength: 1000, autocomplete: "off" }, "Recorded in the audit trail."),
    ],
    "Grant",
    async (form) => {
      const minutes = form.elements["grant-minutes"].value.trim();
      await api.grant(ns, { gpu_minutes: minutes, reason: form.elements["grant-reason"].value });
      await reload(`Granted ${minutes} GPU-minutes to ${ns}.`, "grant-minutes");
    },
  );
  const periods = ["daily", "weekly", "monthly", "none"];
  const numberOrEmpty = (value) => (value === null || value === undefined ? "" : String(value));
  const set = adminForm(
    "budget-form",
    "Set budget",
    [
      input(
        "budget-minutes",
        "Budget (GPU-minutes per period)",
        { type: "number", min: "0", step: "any", inputmode: "decimal", value: numberOrEmpty(budget.budget_gpu_minutes) },
        "Empty for unlimited.",
      ),
      h(
        "div",
        { class: "field" },
        h("label", { for: "budget-period" }, "Period"),
        h("select", { id: "budget-period", name: "budget-period" }, periods.map((p) => h("option", { value: p, selected: p === budget.period.kind }, p))),
      ),
      input("budget-warn", "Warn at fraction used", { type: "number", min: "0.0001", max: "1", step: "any", required: true, value: String(budget.warn_at_fraction) }),
      input("budget-max-share", "Largest GPU share per pod", { type: "number", min: "0", step: "any", value: numberOrEmpty(budget.max_gpu_share_per_pod) }, "Empty for no cap."),
      input("budget-concurrent", "Concurrent GPU limit", { type: "number", min: "0", step: "any", value: numberOrEmpty(budget.concurrent_gpu_limit) }, "Empty for no limit."),
    ],
    "Save budget",
    async (form) => {
      await api.putBudget(ns, {
        budget_gpu_minutes: optionalNumber(form, "budget-minutes"),
        period: form.elements["budget-period"].value,
        warn_at_fraction: form.elements["budget-warn"].value,
        max_gpu_share_per_pod: optionalNumber(form, "budget-max-share"),
        concurrent_gpu_limit: optionalNumber(form, "budget-concurrent"),
      });
      await reload(`Saved the budget of ${ns}.`, "budget-minutes");
    },
  );
  const parts = [h("h2", { id: "admin-title" }, "Administer"), h("div", { class: "forms" }, grant, set)];
  if (budget.source === "namespace") {
    parts.push(
      h(
        "button",
        {
          type: "button",
          id: "budget-reset",
          class: "secondary",
          onclick: async () => {
            if (!window.confirm(`Return ${ns} to the cluster default budget?`)) return;
            try {
              await api.deleteBudget(ns);
              await reload(`${ns} follows the cluster default again.`, "budget-minutes");
            } catch (failure) {
              ctx.status(failure.message);
            }
          },
        },
        "Return to the default budget",
      ),
    );
  }
  return h("section", { id: "admin", "aria-labelledby": "admin-title" }, parts);
}

export async function renderNamespace(view, ctx, ns, focusId) {
  ctx.status(`Loading ${ns}…`);
  const [who, budget, hours, pods, days, grants, workloads] = await Promise.all([
    api.whoami(ns),
    api.budget(ns),
    api.usage(ns, "hour"),
    api.usage(ns, "pod"),
    api.usage(ns, "day"),
    api.grants(ns).catch((error) => {
      if (error instanceof ApiError && (error.status === 404 || error.status === 405)) return null; // an older timekeeper
      throw error;
    }),
    api.usage(ns, "workload").catch((error) => {
      if (error instanceof ApiError && error.status === 422) return null; // an older timekeeper
      throw error;
    }),
  ]);
  const mayAdminister = who.namespace && who.namespace.may_administer;
  let audit = null;
  if (who.may_administer) audit = await api.audit(ns, 100);
  const now = new Date(hours.until).getTime();

  const reload = async (message, focus) => {
    await renderNamespace(view, ctx, ns, focus);
    ctx.status(message);
  };

  const sections = [
    h("p", { class: "breadcrumb" }, h("a", { href: "#/" }, "All namespaces")),
    h("h1", { id: "ns-title", tabindex: "-1" }, ns),
    summary(budget, now),
    modelBudgets(budget, now),
    h("section", { "aria-labelledby": "chart-title" }, h("h2", { id: "chart-title" }, "Burn-down"), burnDown(budget, hours, hours.until)),
    workloads && h("section", { "aria-labelledby": "workloads-title" }, h("h2", { id: "workloads-title" }, "Usage by workload"), usageTable("usage-workloads", "GPU-minutes this period by workload (a Job, JobSet, gang...; a bare pod is its own)", "Workload", workloads)),
    h("section", { "aria-labelledby": "pods-title" }, h("h2", { id: "pods-title" }, "Usage by pod"), usageTable("usage-pods", "GPU-minutes this period by pod", "Pod", pods)),
    h("section", { "aria-labelledby": "days-title" }, h("h2", { id: "days-title" }, "Usage by day"), usageTable("usage-days", "GPU-minutes this period by day (UTC)", "Day", days)),
  ];
  const revoke = async (grant) => {
    if (!window.confirm(`Revoke the grant of ${gpuMinutes(grant.gpu_minutes)} GPU-minutes (${grant.reason})?`)) return;
    try {
      await api.revokeGrant(ns, grant.id);
      await reload(`Revoked the grant of ${gpuMinutes(grant.gpu_minutes)} GPU-minutes.`, "grants-title");
    } catch (failure) {
      ctx.status(failure.message);
    }
  };
  if (grants) {
    sections.push(
      h("section", { "aria-labelledby": "grants-title" }, h("h2", { id: "grants-title", tabindex: "-1" }, "Grants"), grantsTable(grants, mayAdminister, revoke)),
    );
  }
  if (mayAdminister) sections.push(adminSection(ns, budget, ctx, reload));
  if (audit) {
    sections.push(h("section", { "aria-labelledby": "audit-title" }, h("h2", { id: "audit-title" }, "Audit trail"), auditTable(audit)));
  }
  view.replaceChildren(...sections.filter(Boolean));
  ctx.status("");
  document.title = `${ns} · GPU Timekeeper`;
  const target = focusId && document.getElementById(focusId);
  (target || document.getElementById("ns-title")).focus();
}
