// The host, for its operators (`/console/host-report`, refused to anyone else):
// capacity and memory, every organization's live VMs, the replicas and the duties each
// holds, the isolation report of `/readyz`, and the warnings and errors logged lately.

import { action, age, api, fields, h, show, table } from './ui.js';

export async function hostPage() {
  const { data: host } = await api('GET', '/console/host-report');
  const vms = host.vms.map((vm) => h('tr', {}, h('td', {}, vm.session_id), h('td', {}, vm.organization),
    h('td', {}, vm.status), h('td', {}, vm.headless ? 'headless' : 'headful'), h('td', {}, age(vm.created_at)),
    h('td', {}, vm.pool_id ? `${vm.pool_id} (${vm.pool_lease || ''})` : ''), h('td', {}, vm.replica || '')));
  const replicas = host.replicas.map((r) => h('tr', {}, h('td', {}, r.id + (r.this_one ? ' (this one)' : '')),
    h('td', {}, r.address || ''), h('td', {}, r.duties.join(', '))));
  const problems = host.recent_problems.map((p) => h('tr', {}, h('td', {}, p.at), h('td', {}, p.level),
    h('td', {}, p.target), h('td', { class: 'message' }, p.message)));
  const unheld = host.unheld_duties.length
    ? h('p', { class: 'error' }, `No replica holds ${host.unheld_duties.join(', ')} at the moment.`) : null;
  show('Host', h('h1', {}, 'Host'), action('Refresh', hostPage),
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'capacity-title' }, h('h2', { id: 'capacity-title' }, 'Capacity'),
        fields({
          'sized for (browsers)': host.capacity.browsers,
          'live browsers': host.counts.live,
          'headful / headless': `${host.counts.headful} / ${host.counts.headless}`,
          'in pools': host.counts.pooled,
          'starting': host.counts.starting,
          'memory available (GiB)': `${host.capacity.memory_available_gib} of ${host.capacity.memory_total_gib}`,
          'CPUs, load (1 min)': `${host.capacity.cpus}, ${host.capacity.load_average}`,
          'per organization': `${host.capacity.per_organization.live_browsers} live browsers, ${host.capacity.per_organization.live_memory_gib} GiB`,
        })),
      h('section', { class: 'card', 'aria-labelledby': 'replicas-title' }, h('h2', { id: 'replicas-title' }, 'Replicas and duties'),
        unheld, table(['Replica', 'Address', 'Duties'], replicas))),
    h('section', { class: 'card', 'aria-labelledby': 'vms-title' }, h('h2', { id: 'vms-title' }, `Live VMs (${host.counts.live})`),
      table(['Browser', 'Organization', 'State', 'Screen', 'Age', 'Pool', 'Replica'], vms, 'No browser runs here now.')),
    h('section', { class: 'card', 'aria-labelledby': 'problems-title' }, h('h2', { id: 'problems-title' }, 'Recent warnings and errors'),
      table(['Time', 'Level', 'Where', 'Message'], problems, 'Nothing went wrong lately.')),
    h('section', { class: 'card', 'aria-labelledby': 'isolation-title' }, h('h2', { id: 'isolation-title' }, 'Isolation'),
      h('p', {}, host.isolation.sandboxed ? 'Every browser runs in a sandbox of its own.' : 'Browsers are NOT sandboxed on this host.'),
      h('h3', {}, 'Not enforced here'),
      host.isolation.not_enforced.length
        ? h('ul', { id: 'not-enforced' }, host.isolation.not_enforced.map((u) => h('li', {}, h('strong', {}, u.protection), `: ${u.reason}`)))
        : h('p', {}, 'Nothing: every protection is in force.'),
      h('h3', {}, 'Enforced'), h('ul', {}, host.isolation.enforced.map((line) => h('li', {}, line))),
      h('h3', {}, 'What the host offers'), fields(host.isolation.host)));
}
