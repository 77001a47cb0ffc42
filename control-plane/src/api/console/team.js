// The team: API keys, projects, limits, usage, and the audit log.

import {
  action, age, api, can, everyItem, field, fields, form, h, items, link, navigate, show, table,
} from './ui.js';

/** The team: keys, projects, limits, usage. `revealed`: a key's secret just made, shown once. */
export async function teamPage(revealed = null) {
  const sections = [h('h1', {}, 'Team'), h('p', {}, link('/console/team/audit', 'The audit log'))];
  const secret = h('div', { 'aria-live': 'polite' }, revealed ? h('div', { class: 'notice' },
    h('p', {}, `${revealed.what} Copy it now: it is not shown again.`),
    h('code', { class: 'secret', id: 'new-secret' }, revealed.key)) : null);
  const projects = can('projects', 'read')
    ? items((await api('GET', '/org/projects').catch(() => ({ data: [] }))).data) : [];
  const projectName = (id) => (projects.find((p) => p.id === id) || { name: id }).name;
  if (can('api_keys', 'read')) {
    const { data } = await api('GET', '/org/api_keys');
    const write = can('api_keys', 'write');
    const rows = items(data).map((key) => h('tr', {}, h('td', {}, key.name), h('td', {}, key.masked_key || ''),
      h('td', {}, key.project_id ? projectName(key.project_id) : 'every project'), h('td', {}, age(key.created_at)), h('td', {}, key.last_used_at ? age(key.last_used_at) : 'never'),
      h('td', {}, write ? [
        action('Rotate', async () => {
          const { data: made } = await api('POST', `/org/api_keys/${key.id}/rotate`, {});
          await teamPage({ key: made.key, what: `The new secret of ${key.name}.` });
        }),
        action('Revoke', async () => { await api('DELETE', `/org/api_keys/${key.id}`); await teamPage(); }, 'danger'),
      ] : '')));
    sections.push(h('h2', {}, 'API keys'), secret,
      write ? form('New API key', [
        field('Name', 'name', { type: 'text', required: true }),
        projects.length ? h('div', {}, h('label', { for: 'key-project' }, 'Project'),
          h('select', { id: 'key-project', name: 'project_id' }, h('option', { value: '' }, 'every project'),
            projects.map((p) => h('option', { value: p.id }, p.name)))) : null,
      ], async (values) => {
        const request = { name: values.name };
        if (values.project_id) request.project_id = values.project_id;
        const { data: made } = await api('POST', '/org/api_keys', request);
        await teamPage({ key: made.key, what: `The secret of ${values.name}.` });
      }, 'Create key') : null,
      table(['Name', 'Key', 'Project', 'Age', 'Last used', ''], rows, 'No keys.'));
  }
  if (can('projects', 'read')) {
    sections.push(h('h2', {}, 'Projects'),
      can('projects', 'write') ? form('New project', [field('Project name', 'name', { type: 'text', required: true })],
        async (values) => { await api('POST', '/org/projects', { name: values.name }); await teamPage(); }, 'Create project') : null,
      table(['Name', 'Id', 'Status'], projects.map((p) =>
        h('tr', {}, h('td', {}, p.name), h('td', {}, p.id), h('td', {}, p.status || '')))));
  }
  if (can('organization', 'read')) {
    const { data } = await api('GET', '/org/limits').catch(() => ({ data: null }));
    if (data) sections.push(h('h2', {}, 'Limits'), h('div', { class: 'card' }, fields(data)));
  }
  sections.push(h('h2', {}, 'Usage'), await usageChart());
  show('Team', ...sections);
}

/** Browser-hours and invocations per day over the last week, from the lists (a page at a
 * time, at most 1,000 of each). */
async function usageChart() {
  const days = [...Array(7)].map((_, i) => {
    const start = new Date();
    start.setHours(0, 0, 0, 0);
    start.setDate(start.getDate() - (6 - i));
    return { start: start.getTime(), end: start.getTime() + 86400000, hours: 0, invocations: 0 };
  });
  if (can('invocations', 'read')) {
    for (const invocation of await everyItem('/invocations')) {
      const at = Date.parse(invocation.started_at);
      const day = days.find((d) => d.start <= at && at < d.end);
      if (day) day.invocations += 1;
    }
  }
  let live = 0;
  for (const b of await everyItem('/browsers?status=all')) {
    const from = Date.parse(b.created_at);
    const to = b.deleted_at ? Date.parse(b.deleted_at) : Date.now();
    if (!b.deleted_at) live += 1;
    for (const day of days) day.hours += Math.max(0, Math.min(to, day.end) - Math.max(from, day.start)) / 3600000;
  }
  const chart = (label, value, unit) => {
    const most = Math.max(0.01, ...days.map(value));
    return h('div', { class: 'chart', role: 'img', 'aria-label': `${label}: ${days.map((d) => value(d).toFixed(unit === 'h' ? 1 : 0)).join(', ')}` },
      days.map((day) => {
        const bar = h('div', { title: `${new Date(day.start).toDateString()}: ${value(day).toFixed(unit === 'h' ? 1 : 0)} ${unit}` });
        bar.style.height = `${Math.round((value(day) / most) * 100)}%`; // CSSOM, which the CSP allows
        return bar;
      }));
  };
  return h('figure', { class: 'card' },
    h('p', {}, 'Browser-hours per day'), chart('Browser-hours per day', (d) => d.hours, 'h'),
    h('p', {}, 'Invocations per day'), chart('Invocations per day', (d) => d.invocations, 'invocations'),
    h('figcaption', {}, `The last 7 days, oldest first. Live browsers now: ${live}.`));
}

export async function auditPage() {
  const query = new URLSearchParams(location.search);
  const end = new Date();
  const start = new Date(end.getTime() - Number(query.get('hours') || 24) * 3600000);
  const params = new URLSearchParams({ start: start.toISOString(), end: end.toISOString(), limit: '100' });
  for (const name of ['method', 'search', 'page_token']) if (query.get(name)) params.set(name, query.get(name));
  const { data, headers } = await api('GET', `/audit-logs?${params}`);
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter the audit log' },
    h('div', {}, h('label', { for: 'audit-method' }, 'Method'), h('select', { id: 'audit-method', name: 'method' },
      ['', 'GET', 'POST', 'PATCH', 'PUT', 'DELETE'].map((m) => h('option', { value: m, selected: m === (query.get('method') || '') }, m || 'any')))),
    h('div', {}, h('label', { for: 'audit-search' }, 'Search'), h('input', { id: 'audit-search', name: 'search', type: 'search', value: query.get('search') || '' })),
    h('div', {}, h('label', { for: 'audit-hours' }, 'Hours back'), h('input', { id: 'audit-hours', name: 'hours', type: 'number', min: 1, value: query.get('hours') || 24 })),
    h('button', { type: 'submit' }, 'Filter'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    const values = new URLSearchParams([...new FormData(filters)].filter(([, v]) => v));
    navigate(`/console/team/audit?${values}`);
  });
  const rows = items(data).map((e) => h('tr', {}, h('td', {}, e.timestamp), h('td', {}, e.method), h('td', {}, e.path),
    h('td', {}, String(e.status)), h('td', {}, e.email || e.api_key_id || e.auth_strategy || '')));
  const next = headers.get('x-next-page-token');
  show('Audit log', h('p', {}, link('/console/team', '← Team')), h('h1', {}, 'Audit log'), filters,
    table(['Time', 'Method', 'Path', 'Status', 'Who'], rows, 'No calls in this window.'),
    next ? h('div', { class: 'pager' }, link(`/console/team/audit?${new URLSearchParams({ ...Object.fromEntries(query), page_token: next })}`, 'Older')) : null);
}
